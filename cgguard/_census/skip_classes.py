"""The classes of torch.compile's skipped cudagraphs: a fixed set, one per cause torch states.

torch's message for a skip carries node names, device lists, op names, counts and the user's
stack trace, so a metric labelled with it has as many label values as a program has nodes. A
metric is labelled with the class instead; the census and the report keep torch's message.

``SKIP_CLASSES`` is the one table: each class, the words of torch's messages that name it, and
where torch writes them. A message is matched without its stack trace (what follows "Found
from") and without what it puts in parentheses (node names, counts), case aside; the class whose
words come first in it wins, so that a list of reasons (``cudagraph_post_compile``'s "due to
['mutated inputs', 'non-Tensor inputs']") counts under its first. A message none of them names
is ``other``. Paths are torch 2.13's (the sources the words were read from); messages of earlier
releases, read from pytorch's history, are matched as well.
"""

from __future__ import annotations

from typing import Final

from cgguard._data.census import skip_reason

# compile_skips's reason where torch bumped its counter without giving one.
NO_REASON: Final = "no reason given by torch"
OTHER: Final = "other"

# (class, the words that name it, where torch writes them).
SKIP_CLASSES: Final[tuple[tuple[str, tuple[str, ...], str], ...]] = (
    (
        "cpu_device",
        ("cpu device", "non-cuda device"),
        "torch/_inductor/cudagraph_utils.py, check_multiple_devices_or_any_cpu_nodes: "
        '"cpu device (NODE)"; earlier releases\' compile_fx.py: "non-cuda device in graph"',
    ),
    (
        "multiple_devices",
        ("multiple devices", "multiple device indices"),
        "torch/_inductor/cudagraph_utils.py, check_multiple_devices_or_any_cpu_nodes: "
        '"multiple devices: DEVICES"; earlier releases\' compile_fx.py: "multiple device '
        'indices without cudagraph_trees"',
    ),
    (
        "mutated_inputs",
        ("mutated inputs", "input mutation", "input storage mutation"),
        "torch/_inductor/cudagraph_utils.py, get_mutation_stack_trace and "
        'check_for_mutation_ignore_cuda_graph_managed_tensor: "mutated inputs (N instances)", '
        'and get_input_storage_mutation_reason: "input storage mutation (N instances)" (set_ on '
        'an input); torch/_inductor/output_code.py, CompiledFxGraph: "mutated inputs"; earlier '
        'releases\' compile_fx.py: "input mutation"',
    ),
    (
        "non_tensor_inputs",
        ("non-tensor inputs",),
        'torch/_inductor/output_code.py, CompiledFxGraph (cudagraph_tests): "non-Tensor inputs"',
    ),
    (
        "incompatible_op",
        (
            "incompatible op",
            "boolean indexing",
            "index put with accumulate",
            "deterministic index put",
        ),
        "torch/_inductor/compile_fx.py, get_first_incompatible_cudagraph_node: "
        '"incompatible op OP"; torch/_dynamo/backends/cudagraphs.py, check_for_skip: '
        '"incompatible op (NODE)"; torch/_inductor/lowering.py, index_put_: "index_put_ '
        'fallback with boolean indexing is not compatible with CUDA graphs"; earlier releases: '
        '"incompatible ops", "index put with accumulate.", "deterministic index put."',
    ),
    (
        "dynamic_shapes",
        ("symbolic shapes",),
        "torch/_inductor/compile_fx.py, with config.triton.cudagraph_skip_dynamic_graphs: "
        '"graph with symbolic shapes inputs and config.triton.cudagraph_skip_dynamic_graphs=True."',
    ),
    (
        "control_flow",
        ("control flow operator",),
        'torch/_inductor/lowering.py, cond and while_loop: "control flow operator: torch.cond." '
        'and "control flow operator: torch.while_loop."',
    ),
    (
        "sparse",
        ("sparsity not handled",),
        'torch/_inductor/ir.py, ExternKernel.process_kernel: "sparsity not handled. Please file '
        'issue for sparse inference weights."',
    ),
    (
        "complex_memory_overlap",
        ("complex memory overlap", "complex input striding"),
        "earlier releases' torch/_inductor/compile_fx.py (cudagraph_tests): \"complex memory "
        'overlap", "complex input striding"',
    ),
    (
        "uncached_allocator",
        ("caching allocator",),
        "torch/_inductor/cudagraph_utils.py, check_caching_allocator_for_cudagraphs: "
        '"cudagraph capture requires the caching allocator; current allocator is uncached"',
    ),
    (
        "rerecord_limit",
        ("re-recording limit",),
        "torch/_inductor/cudagraph_trees.py, CUDAGraphTreeManager: "
        '"skipping cudagraph due to function N exceeding max re-recording limit (=N) on '
        'cudagraph node N due to REASON."',
    ),
    (
        "cpp_wrapper",
        ("cpp-wrapper",),
        "torch/_inductor/compile_fx.py, get_cpp_wrapper_config: "
        '"cpp-wrapper does not support graph partition yet"',
    ),
    (
        "disabled",
        ("bisector", "override_cudagraphs annotation", "force_disable_cudagraph"),
        "turned off on purpose: torch/_inductor/output_code.py, cudagraph_post_compile: "
        '"bisector" (torch\'s CompilerBisector); torch/_inductor/compile_fx.py: "disabling '
        'cudagraphs due to override_cudagraphs annotation" (and "for backward"); '
        'output_code.py, CompiledFxGraph: "force_disable_cudagraph_TESTING_ONLY"',
    ),
    (
        "no_reason",
        (NO_REASON,),
        "torch bumped its counter without a message or a graph's reason: "
        "torch/_inductor/output_code.py, CompiledFxGraph.post_compile, where a CUDAGraphPolicy's "
        "should_wrap() returns False",
    ),
)


def skip_class(message: str) -> str:
    """The class (``SKIP_CLASSES``) of torch's ``message`` for a skipped cudagraph, or
    ``other``: read in its reason as the census groups it (cgguard._data.census.skip_reason),
    without the user's code torch appends or the names in parentheses."""
    text = skip_reason(message).lower()
    found = OTHER
    first = len(text)
    for name, words, _ in SKIP_CLASSES:
        for word in words:
            at = text.find(word)
            if 0 <= at < first:
                found, first = name, at
    return found


def skip_class_names() -> tuple[str, ...]:
    """Every class a skip may be counted under, ``other`` last."""
    return (*(name for name, _, _ in SKIP_CLASSES), OTHER)
