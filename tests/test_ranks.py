"""Ranks of a job: the capture manifest (cgguard._data.manifest), the ranks compared
(cgguard._data.rank_compare), the collectives seen inside captures, a communication resource's
first use inside one, and the live check (cgguard.check_ranks), in one process with a one-rank
gloo group; tests/test_ranks_job.py runs two ranks under torchrun."""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING, Any

import pytest

import cgguard
from cgguard._data import manifest as _manifest
from cgguard._data.manifest import Manifest
from cgguard._data.rank_compare import RankDifference, agreement, compare, groups, missing

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from cgguard._data.schema import ManifestCapture, ManifestDocument

HERE = __file__


def collective(op: str = "all_reduce", numel: int = 8) -> dict[str, Any]:
    """A collective over ranks 0 and 1, as the manifest keeps it; a barrier sends nothing."""
    dtype = None if op == "barrier" else "float32"
    return {"op": op, "ranks": [0, 1], "dtype": dtype, "numel": numel}


def capture(site: str, key: str = "call 1", *collectives: dict[str, Any]) -> ManifestCapture:
    return {
        "site": site,
        "key": key,
        "outcome": "ended",
        "collectives": list(collectives),  # type: ignore[typeddict-item]
    }


def manifest(*captures: ManifestCapture, rank: int = 0) -> ManifestDocument:
    per_site: dict[str, int] = {}
    for each in captures:
        per_site[each["site"]] = per_site.get(each["site"], 0) + 1
    return {
        "identity": {"rank": rank, "world_size": 2},
        "captures": list(captures),
        "per_site": per_site,
        "later": 0,
    }


A = capture("m.py:10 (in capture_model)", "call 1", collective())
B = capture("m.py:20 (in capture_model)", "call 1", collective(), collective("barrier", 0))


def test_a_manifest_keys_each_capture_by_its_ordinal_at_its_site() -> None:
    """Captures are kept in order; a capture's key is which call at its site it is."""
    kept = Manifest()
    kept.recording = True
    for place in [("m.py", 10, "f"), ("m.py", 10, "f"), ("n.py", 3, "g"), None]:
        kept.begin(place)
    document = kept.document()
    assert [(c["site"], c["key"]) for c in document["captures"]] == [
        ("m.py:10 (in f)", "call 1"),
        ("m.py:10 (in f)", "call 2"),
        ("n.py:3 (in g)", "call 1"),
        ("an unknown site", "call 1"),
    ]
    assert document["per_site"] == {"m.py:10 (in f)": 2, "n.py:3 (in g)": 1, "an unknown site": 1}


def test_a_manifest_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past KEPT captures only counts grow; past COLLECTIVES_KEPT a capture counts the rest."""
    monkeypatch.setattr(_manifest, "KEPT", 3)
    monkeypatch.setattr(_manifest, "COLLECTIVES_KEPT", 2)
    kept = Manifest()
    for _ in range(10):
        opened = kept.begin(("m.py", 1, "f"))
        for _ in range(5):
            opened.issued(collective())  # type: ignore[arg-type]
    document = kept.document()
    assert (len(document["captures"]), document["later"], document["per_site"]) == (
        3,
        7,
        {"m.py:1 (in f)": 10},
    )
    first = document["captures"][0]
    assert (len(first["collectives"]), first.get("collectives_dropped")) == (2, 3)


def test_ranks_that_agree_make_one_group_and_no_difference() -> None:
    """Equal manifests: one group, nothing different, one line saying they agree."""
    manifests = {0: manifest(A, B), 1: manifest(A, B, rank=1)}
    assert (groups(manifests), compare(manifests), agreement(manifests)) == (
        [(0, 1)],
        [],
        "2 ranks agree: 2 captures, 3 collectives inside them",
    )


def test_a_rank_with_one_more_graph_is_named_with_the_capture_the_others_lack() -> None:
    """One more capture: the extra capture and the site's count, each naming both sides."""
    extra = capture("m.py:30 (in warm)")
    manifests = {0: manifest(A, B), 1: manifest(A, B, extra, rank=1), 2: manifest(A, B, rank=2)}
    assert compare(manifests) == [
        RankDifference(
            "extra_capture",
            (1,),
            (0, 2),
            "rank 1 captured 1 more: capture 3 at m.py:30 (in warm) (call 1) is missing on "
            "ranks 0, 2",
            3,
        ),
        RankDifference(
            "count",
            (1,),
            (0, 2),
            "m.py:30 (in warm): captured once on rank 1, 0 times on ranks 0, 2",
        ),
    ]


def test_tensor_parallel_groups_running_the_same_code_agree() -> None:
    """Ranks 0 and 1 all-reduce over their group, ranks 2 and 3 over theirs: the same code,
    so they agree; another size on one group is named."""

    def over(ranks: list[int], numel: int = 8) -> ManifestCapture:
        step = {"op": "all_reduce", "ranks": ranks, "dtype": "float32", "numel": numel}
        return capture("m.py:10 (in capture_model)", "call 1", step)

    manifests = {r: manifest(over([0, 1] if r < 2 else [2, 3]), rank=r) for r in range(4)}
    assert compare(manifests) == []
    manifests[3] = manifest(over([2, 3], numel=16), rank=3)
    assert [(d.kind, d.ranks, d.others) for d in compare(manifests)] == [
        ("collectives", (3,), (0, 1, 2))
    ]


def test_a_rank_issuing_one_more_collective_is_named_at_that_capture() -> None:
    """Another collective sequence inside one capture: the capture and the collective."""
    more = capture("m.py:20 (in capture_model)", "call 1", collective(), collective())
    manifests = {0: manifest(A, B), 1: manifest(A, more, rank=1)}
    assert compare(manifests) == [
        RankDifference(
            "collectives",
            (1,),
            (0,),
            "capture 2 at m.py:20 (in capture_model) (call 1): collective 2 is all_reduce of 8 "
            "float32 over ranks [0, 1] on rank 1, barrier over ranks [0, 1] on rank 0",
            2,
        )
    ]


def test_another_key_or_site_at_the_same_place_in_the_order_is_named() -> None:
    """The same site with another key (other inputs), or another site: told apart."""
    other_key = capture("m.py:10 (in capture_model)", "3 inputs 0a0b0c", collective())
    other_site = capture("m.py:99 (in elsewhere)", "call 1", collective())
    assert [d.kind for d in compare({0: manifest(A), 1: manifest(other_key, rank=1)})] == ["key"]
    assert [d.kind for d in compare({0: manifest(A), 1: manifest(other_site, rank=1)})] == [
        "site",
        "count",
        "count",
    ]


def test_ranks_that_did_not_arrive_are_named() -> None:
    """Of four ranks, two arrived: the other two are named."""
    assert missing([0, 2], 4) == RankDifference(
        "missing", (1, 3), (0, 2), "ranks 1, 3 did not reach the check in time; ranks 0, 2 did"
    )
    assert missing([0, 1], 2) is None


# In one process: a one-rank gloo group, on the simulated runtime.


@pytest.fixture
def group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A one-rank gloo job: RANK and WORLD_SIZE set, the default group made; torn down after."""
    import torch.distributed as dist

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


@pytest.fixture
def simulated() -> Iterator[Any]:
    from cgguard.testing import simulated_cuda

    with simulated_cuda() as simulation:
        yield simulation


def line_of(marker: str) -> int:
    with open(HERE) as source:
        return next(n for n, text in enumerate(source, 1) if marker in text)


def test_collectives_inside_captures_are_kept_in_order(
    group: Any, simulated: Any, events: list[dict[str, Any]]
) -> None:
    """Each capture's collectives, op, group ranks, dtype and size, on the capturing thread;
    one outside every capture is no capture's."""
    import torch

    cgguard.install(cgguard.Config(mode="log"))
    x = torch.ones(4)
    group.all_reduce(x)  # the group's first use, outside: no first_use_in_capture
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1):  # marker: first
        group.all_reduce(x)
    with torch.cuda.graph(g2):  # marker: second
        group.all_gather_single(torch.zeros(4), x)
        group.barrier()
    document = cgguard._process.PROCESS.installation.run.manifest.document()  # type: ignore[union-attr]
    first, second = f"{HERE}:{line_of('marker: first')}", f"{HERE}:{line_of('marker: second')}"
    function = "test_collectives_inside_captures_are_kept_in_order"
    assert document == {
        "identity": {"rank": 0, "world_size": 1, "dist_rank": 0, "dist_world_size": 1},
        "captures": [
            {
                "site": f"{first} (in {function})",
                "key": "call 1",
                "outcome": "ended",
                "collectives": [{"op": "all_reduce", "ranks": [0], "dtype": "float32", "numel": 4}],
            },
            {
                "site": f"{second} (in {function})",
                "key": "call 1",
                "outcome": "ended",
                "collectives": [
                    {"op": "all_gather_single", "ranks": [0], "dtype": "float32", "numel": 4},
                    {"op": "barrier", "ranks": [0], "dtype": None, "numel": 0},
                ],
            },
        ],
        "per_site": {f"{first} (in {function})": 1, f"{second} (in {function})": 1},
        "later": 0,
    }
    assert events == []


def test_a_groups_first_use_inside_a_capture_is_reported_once(
    group: Any, simulated: Any, events: list[dict[str, Any]]
) -> None:
    """Under the simulation a gloo group stands for a device group: its first collective inside
    a capture is first_use_in_capture, naming the group and where the capture began."""
    import torch

    cgguard.install(cgguard.Config(mode="log"))
    x = torch.ones(4)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        group.all_reduce(x)  # marker: first use
        group.all_reduce(x)
    assert [(e["rule"], e["stack"][-1]["line"]) for e in events] == [
        ("first_use_in_capture", line_of("marker: first use"))
    ]
    assert "uses the default group of ranks [0] (gloo), which has run no collective" in str(
        events[0]["message"]
    )


def test_a_collective_through_a_torch_function_mode_is_noted_once(
    group: Any, simulated: Any
) -> None:
    """torch hands a collective to each torch-function mode on the stack, which calls the
    public function again: the capture still holds it once."""
    import torch
    from torch.overrides import TorchFunctionMode

    class Forwarding(TorchFunctionMode):
        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            return func(*args, **(kwargs or {}))

    cgguard.install(cgguard.Config(mode="log"))
    x = torch.ones(4)
    group.all_reduce(x)
    g = torch.cuda.CUDAGraph()
    with Forwarding(), torch.cuda.graph(g):
        group.all_reduce(x)
    captures = cgguard._process.PROCESS.installation.run.manifest.document()["captures"]  # type: ignore[union-attr]
    assert [c["op"] for c in captures[0]["collectives"]] == ["all_reduce"]


def test_one_rank_agrees_with_itself_through_the_store(group: Any, simulated: Any) -> None:
    """check_ranks() in a one-rank job: its manifest goes through the store and back; nothing
    differs, nothing is reported."""
    import torch

    cgguard.install(cgguard.Config(mode="log"))
    with cgguard.testing.capture_violations() as seen:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            torch.ones(2).add_(1)
        assert (cgguard.check_ranks(timeout=5), seen) == ([], [])


def test_check_ranks_without_a_default_group_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No torch.distributed group: one warning line and nothing to compare, never a wait."""
    import torch  # noqa: F401 - torch.distributed is imported with it

    monkeypatch.setenv("RANK", "0")
    cgguard.install(cgguard.Config(mode="log"))
    assert cgguard.check_ranks(timeout=1) == []
    assert capsys.readouterr().err == (
        "cgguard: check_ranks: torch.distributed has no default group in this process "
        "(init_process_group was not called): no ranks to compare\n"
    )


@pytest.mark.parametrize("timeout", [0, -1, True, "5", float("nan"), float("inf")])
def test_check_ranks_refuses_a_timeout_that_is_not_seconds(timeout: object) -> None:
    """A timeout that is not a number of seconds above 0 is one clear error."""
    with pytest.raises(ValueError, match=r"^check_ranks\(timeout=.*\): accepted values are"):
        cgguard.check_ranks(timeout=timeout)  # type: ignore[arg-type]


def test_a_process_without_a_rank_identity_records_no_manifest(simulated: Any) -> None:
    """No RANK, LOCAL_RANK, WORLD_SIZE and no default group: no manifest watcher, no hooks on
    torch.distributed, nothing in the report."""
    import torch  # noqa: F401

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        assert name not in __import__("os").environ
    cgguard.install(cgguard.Config(mode="log"))
    patched = cgguard.status().patched
    assert [p for p in patched if p.startswith("torch.distributed")] == []
    assert not cgguard._process.PROCESS.installation.run.manifest.recording  # type: ignore[union-attr]


def test_the_manifest_can_be_switched_off(simulated: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """CGGUARD_MANIFEST=0 keeps a ranked process's collectives unwrapped."""
    import torch  # noqa: F401

    monkeypatch.setenv("RANK", "0")
    cgguard.install(cgguard.Config.from_environ({"CGGUARD_MANIFEST": "0"}))
    assert [p for p in cgguard.status().patched if p.startswith("torch.distributed")] == []
    cgguard.install(cgguard.Config(mode="log"))
    assert "torch.distributed.all_reduce" in cgguard.status().patched
    cgguard.uninstall()
    function = sys.modules["torch.distributed"].all_reduce
    assert "cgguard" not in function.__code__.co_filename


def capture_model() -> None:
    """A capture window for the test below: a framework's capture phase."""
    import torch

    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        torch.ones(2).add_(1)


def test_rank_check_compares_the_ranks_as_a_capture_window_closes(
    group: Any, simulated: Any
) -> None:
    """CGGUARD_RANK_CHECK: each time a capture window closes the ranks are compared, through
    the store; without it, never."""
    config = cgguard.Config(mode="log", windows=f"{__name__}:capture_model")
    cgguard.install(config)
    manifest = cgguard._process.PROCESS.installation.run.manifest  # type: ignore[union-attr]
    capture_model()
    assert manifest.checks == 0
    cgguard.install(cgguard.Config(mode="log", windows=config.windows, rank_check=True))
    capture_model()
    capture_model()
    assert manifest.checks == 2
    cgguard.uninstall()
    assert cgguard._process.PROCESS.gate.windows.closing == []


# The ranks compared by cgguard report, in one process (tests/test_ranks_job.py runs a real job).


def ranked_report(pid: int, rank: int, *captures: ManifestCapture) -> dict[str, Any]:
    """A rank's report, as cgguard writes it, with its manifest."""
    return {
        "cgguard": "0.1.0",
        "python": "3.11.9",
        "torch": "2.13.0",
        "host": "node-a",
        "pid": pid,
        "written_at": "2026-12-01T05:00:09.000000Z",
        "config": {"mode": "log"},
        "totals": {},
        "violations": [],
        "rank": rank,
        "world_size": 2,
        "manifest": manifest(*captures, rank=rank),
    }


def write_job(folder: Path, *documents: dict[str, Any]) -> Path:
    import json

    folder.mkdir()
    for each in documents:
        (folder / f"r-{each['pid']}.json").write_text(json.dumps(each))
    return folder


def test_the_html_page_shows_the_ranks_and_escapes_their_sites(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The page's Ranks section tables each difference; a site named like markup is text."""
    from cgguard._commands.main import main

    hostile = capture("<img src=x onerror=alert(1)>.py:1 (in f)", "call 1")
    folder = write_job(
        tmp_path / "reports", ranked_report(10, 0, A), ranked_report(11, 1, A, hostile)
    )
    status = main(["report", "--format", "html", str(folder)])
    page = capsys.readouterr().out
    section = page.split('<section id="ranks">', 1)[1].split("</section>", 1)[0]
    assert status == 1
    assert "<img" not in section
    assert "&lt;img src=x onerror=alert(1)&gt;.py:1 (in f) (call 1) is missing on rank 0" in section
    assert section.count("<tr><td>") == 2  # the extra capture, and its site's count


def test_a_report_whose_manifest_is_malformed_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A manifest not as cgguard writes it (a capture without its key) stops cgguard report
    with status 2, naming the file and the field."""
    from cgguard._commands.main import main

    broken = ranked_report(10, 0, A)
    del broken["manifest"]["captures"][0]["key"]
    folder = write_job(tmp_path / "reports", broken)
    status = main(["report", str(folder)])
    err = capsys.readouterr().err
    assert (status, "r-10.json" in err, '"key"' in err) == (2, True, True)


def test_with_inspection_a_capture_is_keyed_by_its_inputs(group: Any, simulated: Any) -> None:
    """Inspection saw the graph's inputs: the key is their count and a digest of their dtypes
    and shapes, alike for alike inputs and not for others."""
    import torch

    cgguard.install(cgguard.Config(mode="log", inspect=True))
    keys = []
    for shape in [(4,), (4,), (8,)]:
        x = torch.ones(shape, device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            x.mul(2)
        keys.append(cgguard._process.PROCESS.installation.run.manifest.captures[-1].key)  # type: ignore[union-attr]
    assert (keys[0] == keys[1], keys[0] == keys[2]) == (True, False)
    assert [key.split(" ")[:2] for key in keys] == [["1", "inputs"]] * 3


def test_an_nccl_group_whose_communicator_exists_is_no_first_use(
    group: Any, simulated: Any, events: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On NCCL (told here, where torch has none) a group's first collective inside a capture is
    not reported while its communicator exists, and is, once, where it does not."""
    import torch

    from cgguard._ranks import first_use

    ready = {"now": True}
    monkeypatch.setattr(first_use, "backend_of", lambda group: "nccl")
    monkeypatch.setattr(first_use, "nccl_ready", lambda group: ready["now"])
    cgguard.install(cgguard.Config(mode="log"))
    x = torch.ones(4)
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        group.all_reduce(x)
    assert events == []
    ready["now"] = False
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        group.all_reduce(x)
        group.all_reduce(x)
    assert [e["rule"] for e in events] == ["first_use_in_capture"]
    assert "whose NCCL communicator does not exist yet" in str(events[0]["message"])


def test_the_first_use_of_a_peer_and_of_the_default_group_named_either_way() -> None:
    """A send to a peer is its pair's first use until one outside a capture; the default group
    used as None outside a capture is warm when named by its object inside one, and the other
    way round."""
    from cgguard._ranks import first_use

    seen = first_use.FirstUse()
    seen.used(None)
    assert seen.warm == {first_use.DEFAULT: None}
    assert first_use.key_of(None, 1) not in seen.warm
    seen.used(None, 1)
    assert first_use.key_of(None, 1) in seen.warm


def test_a_reconfiguration_keeps_one_watcher_and_its_hooks(group: Any, simulated: Any) -> None:
    """install() again with another configuration: the manifest's watcher, its hooks on
    torch.distributed and what it knows of groups used are the same, and captures after it
    still hold their collectives."""
    import torch

    cgguard.install(cgguard.Config(mode="log"))
    installation = cgguard._process.PROCESS.installation
    assert installation is not None
    before = [w for w in installation.watchers if type(w).__name__ == "RankManifest"]
    x = torch.ones(4)
    group.all_reduce(x)
    cgguard.install(cgguard.Config(mode="raise"))
    after = [w for w in installation.watchers if type(w).__name__ == "RankManifest"]
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        group.all_reduce(x)
    captures = installation.run.manifest.document()["captures"]
    assert (after == before, len(before), [len(c["collectives"]) for c in captures]) == (
        True,
        1,
        [1],
    )


def test_p2p_ops_keep_torchs_identity_checks(group: Any, simulated: Any) -> None:
    """P2POp checks its function by identity: with cgguard installed, dist.isend and
    dist.irecv are torch's own, so an op made with them, or with a name bound before install,
    passes torch's checks of a batch."""
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    bound = dist.isend
    cgguard.install(cgguard.Config(mode="log"))
    assert "cgguard" not in dist.isend.__code__.co_filename
    x = torch.ones(2)
    ops = [dist.P2POp(dist.isend, x, 0), dist.P2POp(bound, x, 0), dist.P2POp(dist.irecv, x, 0)]
    distributed_c10d._check_p2p_op_list(ops)
    assert [op.op for op in ops] == [distributed_c10d.isend, distributed_c10d.isend, dist.irecv]


def test_a_symmetric_memory_allocation_inside_a_capture_is_reported(
    group: Any, simulated: Any, events: list[dict[str, Any]]
) -> None:
    """symm_mem.empty() inside a capture is reported before torch runs it (torch's own failure
    follows on this CPU build)."""
    import torch
    import torch.distributed._symmetric_memory as symm_mem

    cgguard.install(cgguard.Config(mode="log"))
    # torch's CPU build cannot allocate it: its own failure is not cgguard's.
    with torch.cuda.graph(torch.cuda.CUDAGraph()), contextlib.suppress(Exception):
        symm_mem.empty(4, device="cuda")  # marker: symm
    assert [(e["rule"], e["api"], e["stack"][-1]["line"]) for e in events] == [
        (
            "first_use_in_capture",
            "torch.distributed._symmetric_memory.empty",
            line_of("marker: symm"),
        )
    ]


# On a device: what the simulation cannot say (docs/ranks.md, "What a device would confirm").


@pytest.mark.cuda
@pytest.mark.parametrize("eager", [False, True], ids=["lazy", "device_id"])
def test_nccl_first_collective_inside_a_capture_on_a_device(
    eager: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, events: list[dict[str, Any]]
) -> None:
    """A one-rank NCCL group's first all_reduce inside a capture: reported where the group was
    made lazily, not where init_process_group(device_id=...) made its communicator. What CUDA
    and NCCL then do is printed, for the record of this device."""
    import torch
    import torch.distributed as dist

    if not dist.is_nccl_available():
        pytest.skip("this torch has no NCCL")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    how: dict[str, Any] = {"device_id": torch.device("cuda", 0)} if eager else {}
    store = f"file://{tmp_path}/store"
    dist.init_process_group("nccl", init_method=store, rank=0, world_size=1, **how)
    try:
        cgguard.install(cgguard.Config(mode="log"))
        x = torch.ones(4, device="cuda")
        stream = torch.cuda.Stream()
        outcome = "captured"
        try:
            with torch.cuda.graph(torch.cuda.CUDAGraph(), stream=stream):
                dist.all_reduce(x)
        except Exception as exc:
            outcome = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
        print(
            f"NCCL {nccl}, {'eager' if eager else 'lazy'}: first all_reduce in capture: {outcome}"
        )
        reported = [e["rule"] for e in events if e["rule"] == "first_use_in_capture"]
        assert reported == ([] if eager else ["first_use_in_capture"])
    finally:
        torch.cuda.synchronize()
        dist.destroy_process_group()


def test_a_process_given_its_rank_by_init_process_group_alone_installs_again(
    tmp_path: Path, simulated: Any
) -> None:
    """No launcher variable: the manifest starts once cgguard is installed again after the
    default group exists (docs/ranks.md), with torch.distributed's rank as the identity."""
    import torch
    import torch.distributed as dist

    cgguard.install(cgguard.Config(mode="log"))
    assert "torch.distributed.all_reduce" not in cgguard.status().patched
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        cgguard.install(cgguard.status().config)
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            pass
        document = cgguard._process.PROCESS.installation.run.manifest.document()  # type: ignore[union-attr]
        assert (document["identity"], len(document["captures"])) == (
            {"dist_rank": 0, "dist_world_size": 1},
            1,
        )
    finally:
        dist.destroy_process_group()


def test_torch_compile_still_traces_a_watched_collective(group: Any) -> None:
    """torch.compile traces dist.all_reduce as a functional collective through its own table:
    the hook joins it there, so fullgraph compilation works with cgguard installed, and the
    table is as it was after uninstall."""
    import torch
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as functional

    table = dict(functional.traceable_collective_remaps)
    cgguard.install(cgguard.Config(mode="log"))

    def step(x: Any) -> Any:
        y = x * 2
        dist.all_reduce(y)
        return y + 1

    compiled = torch.compile(step, fullgraph=True, backend="eager")
    assert compiled(torch.ones(4)).tolist() == [3.0] * 4
    cgguard.uninstall()
    assert functional.traceable_collective_remaps == table


def failing_capture_model() -> None:
    """A capture window that fails on its way out, as an interrupted capture phase does."""
    raise ValueError("interrupted")


def test_a_window_closed_by_an_exception_runs_no_rank_check(group: Any, simulated: Any) -> None:
    """CGGUARD_RANK_CHECK: a window left by an exception compares nothing: the program is not
    kept waiting for ranks that will not come."""
    cgguard.install(
        cgguard.Config(mode="log", windows=f"{__name__}:failing_capture_model", rank_check=True)
    )
    manifest = cgguard._process.PROCESS.installation.run.manifest  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="interrupted"):
        failing_capture_model()
    assert manifest.checks == 0


def capture_phases() -> Any:
    """A generator capture window: captures at each step, yielding between them."""
    import torch

    for _ in range(3):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            torch.ones(2).add_(1)
        yield


def test_rank_check_runs_at_each_close_and_not_at_a_pause(group: Any, simulated: Any) -> None:
    """A window closed three times in a loop is three checks; a generator window's yields
    pause it, and only its end is a check."""
    windows = f"{__name__}:capture_model,{__name__}:capture_phases"
    cgguard.install(cgguard.Config(mode="log", windows=windows, rank_check=True))
    manifest = cgguard._process.PROCESS.installation.run.manifest  # type: ignore[union-attr]
    for _ in range(3):
        capture_model()
    assert manifest.checks == 3
    for _ in capture_phases():
        pass
    assert manifest.checks == 4


SYMMETRIC_LATE = """
import torch, cgguard
cgguard.install(cgguard.Config(mode="log"))
before = [p for p in cgguard.status().patched if "symmetric" in p]
import torch.distributed._symmetric_memory as module
after = [p for p in cgguard.status().patched if "symmetric" in p]
cgguard.uninstall()
print(before, after, "cgguard" in module.empty.__code__.co_filename)
"""


@pytest.mark.subprocess
def test_symmetric_memory_imported_after_install_is_hooked_and_listed() -> None:
    """Symmetric memory, imported by the program after install, gets its hooks as the
    watchers' other hooks do: listed in status(), and taken off at uninstall."""
    import subprocess

    from helpers import clean_environ

    done = subprocess.run(
        [sys.executable, "-c", SYMMETRIC_LATE],
        env=clean_environ(RANK="0", WORLD_SIZE="1"),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    name = "torch.distributed._symmetric_memory"
    expected = f"[] ['{name}.rendezvous', '{name}.empty'] False\n"
    assert (done.returncode, done.stdout) == (0, expected), done.stderr
