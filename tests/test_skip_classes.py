"""The classes of torch.compile's skipped cudagraphs (cgguard._census.skip_classes): each of
torch's messages, as its source writes it, under one class of a fixed set."""

from __future__ import annotations

from pathlib import Path

import pytest

from cgguard._census.skip_classes import NO_REASON, SKIP_CLASSES, skip_class, skip_class_names

STACK = ' Found from : \n   File "/srv/model.py", line 12, in forward\n    y = x.cpu()\n'

# torch 2.13's messages as they reach its counter, each written as its source builds it (the
# function named beside it), with what it fills in made up; then earlier releases' messages.
MESSAGES = [
    ("skipping cudagraphs due to cpu device (arg0_1)", "cpu_device"),  # cudagraph_utils.py
    ("skipping cudagraphs due to cpu device (arg0_1)." + STACK, "cpu_device"),
    ("skipping cudagraphs due to non-cuda device in graph", "cpu_device"),
    ("skipping cudagraphs due to multiple devices: ", "multiple_devices"),
    (
        "skipping cudagraphs due to skipping cudagraphs due to multiple devices: "
        "device(type='cuda', index=0), device(type='cuda', index=1)",
        "multiple_devices",
    ),
    (
        "skipping cudagraphs due to ['multiple device indices without cudagraph_trees']",
        "multiple_devices",
    ),
    ("skipping cudagraphs due to mutated inputs (2 instances)." + STACK, "mutated_inputs"),
    ("skipping cudagraphs due to mutated inputs", "mutated_inputs"),
    ("skipping cudagraphs due to input storage mutation (1 instances)." + STACK, "mutated_inputs"),
    ("skipping cudagraphs due to input mutation", "mutated_inputs"),
    ("skipping cudagraphs due to ['non-Tensor inputs']", "non_tensor_inputs"),
    # cudagraph_post_compile's list of reasons: the first named counts.
    ("skipping cudagraphs due to ['non-Tensor inputs', 'mutated inputs']", "non_tensor_inputs"),
    ("skipping cudagraphs due to ['mutated inputs', 'non-Tensor inputs']", "mutated_inputs"),
    (
        "skipping cudagraphs due to disabling cudagraphs due to incompatible op "
        "aten._local_scalar_dense.default Found from " + STACK,
        "incompatible_op",
    ),
    ("skipping cudagraphs due to incompatible op (nonzero_1)", "incompatible_op"),
    (
        "skipping cudagraphs due to index_put_ fallback with boolean indexing is not compatible "
        "with CUDA graphs" + STACK,
        "incompatible_op",
    ),
    ("skipping cudagraphs due to deterministic index put." + STACK, "incompatible_op"),
    ("skipping cudagraphs due to index put with accumulate.", "incompatible_op"),
    ("skipping cudagraphs due to ['incompatible ops']", "incompatible_op"),
    (
        "skipping cudagraphs due to graph with symbolic shapes inputs and "
        "config.triton.cudagraph_skip_dynamic_graphs=True. Found from " + STACK,
        "dynamic_shapes",
    ),
    ("skipping cudagraphs due to control flow operator: torch.cond." + STACK, "control_flow"),
    ("skipping cudagraphs due to control flow operator: torch.while_loop.", "control_flow"),
    (
        "skipping cudagraphs due to sparsity not handled. Please file issue for sparse "
        "inference weights.",
        "sparse",
    ),
    ("skipping cudagraphs due to ['complex memory overlap']", "complex_memory_overlap"),
    ("skipping cudagraphs due to complex input striding", "complex_memory_overlap"),
    (
        "skipping cudagraphs due to cudagraph capture requires the caching allocator; current "
        "allocator is uncached",
        "uncached_allocator",
    ),
    (
        "skipping cudagraph due to function 3 exceeding max re-recording limit (=50) on "
        "cudagraph node 2 due to static input data pointer changed.",
        "rerecord_limit",
    ),
    (
        "skipping cudagraphs due to cpp-wrapper does not support graph partition yet",
        "cpp_wrapper",
    ),
    ("skipping cudagraphs due to bisector", "disabled"),
    ("disabling cudagraphs due to override_cudagraphs annotation", "disabled"),
    ("disabling cudagraphs for backward due to override_cudagraphs annotation", "disabled"),
    ("skipping cudagraphs due to ['force_disable_cudagraph_TESTING_ONLY']", "disabled"),
    (NO_REASON, "no_reason"),
    ("skipping cudagraphs due to a reason torch has yet to write", "other"),
    ("", "other"),
]


@pytest.mark.parametrize(("message", "expected"), MESSAGES)
def test_each_message_of_torch_is_one_class(message: str, expected: str) -> None:
    """A message of torch's source, with its node names and stack trace, is its cause's class."""
    assert skip_class(message) == expected


def test_the_users_code_in_a_stack_trace_does_not_choose_the_class() -> None:
    """Words of the user's code after "Found from" (here "cpu device") are not read."""
    message = (
        "skipping cudagraphs due to mutated inputs (1 instances). Found from : \n"
        '  File "m.py", line 3, in f\n    # runs on the cpu device too\n'
    )
    assert skip_class(message) == "mutated_inputs"


def test_node_names_in_parentheses_do_not_choose_the_class() -> None:
    """A node named after the user's variable, in parentheses, is not read."""
    assert (
        skip_class("skipping cudagraphs due to incompatible op (cpu device)") == "incompatible_op"
    )


def test_the_classes_are_a_fixed_set_with_other_last() -> None:
    """Every class is distinct, named in snake case, and 'other' takes what none names."""
    names = skip_class_names()
    assert names == (
        "cpu_device",
        "multiple_devices",
        "mutated_inputs",
        "non_tensor_inputs",
        "incompatible_op",
        "dynamic_shapes",
        "control_flow",
        "sparse",
        "complex_memory_overlap",
        "uncached_allocator",
        "rerecord_limit",
        "cpp_wrapper",
        "disabled",
        "no_reason",
        "other",
    )
    # Matched against a lowercased message: a word with a capital letter would never match.
    assert [w for _, words, _ in SKIP_CLASSES for w in words if w != w.lower()] == []
    # Each class cites where torch writes its words.
    assert [name for name, _, source in SKIP_CLASSES if not source] == []


def test_the_metrics_page_lists_every_class_in_order() -> None:
    """docs/integrations.md's table of skip classes is the table's classes, in its order."""
    page = (Path(__file__).parent.parent / "docs" / "integrations.md").read_text()
    section = page.split("### Skip classes", 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == list(skip_class_names())
