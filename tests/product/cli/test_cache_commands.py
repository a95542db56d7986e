"""``python -m hyperexport cache ...``: ls, show, verify, gc and status against real caches.

Most tests build with the small real stages of ``tests/helpers/fake_stages.py`` (no torch) and call the
command's ``main`` in process; ages are set with ``os.utime`` the way time would. The acceptance
test builds two toy recipes with the real pipeline; ``status`` runs in a subprocess to prove it
imports no torch; the race test runs ``gc`` in another process while builds run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hyperexport.base import versions
from hyperexport.base.sizes import human_size
from hyperexport.engine.inventory import disk_usage
from hyperexport.engine.store import CacheStore
from hyperexport.library.defaults import DEFAULT_OPSET
from hyperexport.product.builds.session import BuildOutcome, run_build
from hyperexport.product.cli import cache as cache_cli
from hyperexport.product.config import BuildSettings, Recipe
from tests.engine.fakes import pipeline
from tests.helpers.builds import build as real_build
from tests.helpers.builds import toy_package_in, toy_package_recipe
from tests.helpers.cli import HEAVY, TOY_RECIPE
from tests.helpers.fake_recipe import recipe
from tests.helpers.statuses import statuses as real_statuses

HOUR = 3600.0


def build(tmp_path: Path, name: str = "fake", **overrides: object) -> BuildOutcome:
    settings = BuildSettings(
        cache_dir=str(tmp_path / "cache"),
        outputs_dir=tmp_path / "outputs",
        dry_run=False,
        force=(),
    )
    outcome = run_build(
        recipe(name=name, **overrides), settings, stages=pipeline(), load_model=lambda: "m"
    )
    assert outcome.exit_code == 0, outcome.lines
    return outcome


def statuses(outcome: BuildOutcome) -> list[str]:
    return [s.status for s in outcome.result.stages]


def keys(outcome: BuildOutcome) -> dict[str, str]:
    return {s.name: s.key or "" for s in outcome.result.stages}


def run_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, list[str], str]:
    """``cache <args> --cache-dir <tmp>/cache``: (exit code, stdout lines, stderr)."""
    code = cache_cli.main([*args, "--cache-dir", str(tmp_path / "cache")])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def age(store: CacheStore, key: str, seconds: float) -> None:
    """Make entry ``key`` and its blobs look last used ``seconds`` ago."""
    then = time.time() - seconds
    os.utime(store.action_path(key), (then, then))
    for f in store.read_entry(key).outputs:
        os.utime(store.blob_path(f.digest), (then, then))


def assert_consistent(store: CacheStore) -> None:
    """No entry names a missing blob (the invariant gc and verify must keep)."""
    for key, _path in store.entry_paths():
        for f in store.read_entry(key).outputs:
            assert store.blob_path(f.digest).is_file(), f"{key[:12]} lost {f.path}"


@pytest.fixture
def store(tmp_path: Path) -> CacheStore:
    return CacheStore(tmp_path / "cache")


# -- last use ----------------------------------------------------------------------------
def test_hit_records_last_use_and_a_dry_run_does_not(tmp_path: Path, store: CacheStore) -> None:
    first = build(tmp_path)
    trace = keys(first)["trace"]
    age(store, trace, 5 * HOUR)
    old = store.action_path(trace).stat().st_mtime
    CacheStore(store.root, read_only=True).lookup(trace)
    assert store.action_path(trace).stat().st_mtime == old
    assert statuses(build(tmp_path)) == ["hit"] * 4
    assert store.action_path(trace).stat().st_mtime > time.time() - 60


def test_entry_records_the_recipe_that_built_it(tmp_path: Path, store: CacheStore) -> None:
    outcome = build(tmp_path, name="alpha")
    entry = json.loads(store.action_path(keys(outcome)["export"]).read_text())
    assert entry["build"] == "alpha"


# -- ls / show ---------------------------------------------------------------------------
def test_ls_lists_stage_recipe_size_and_last_use_oldest_first(
    tmp_path: Path, store: CacheStore, capsys: pytest.CaptureFixture[str]
) -> None:
    alpha = keys(build(tmp_path, name="alpha"))
    beta = keys(build(tmp_path, name="beta", opset=16))  # shares alpha's trace
    for i, key in enumerate(alpha.values()):
        age(store, key, (10 - i) * HOUR)
    code, lines, _ = run_cache(tmp_path, capsys, "ls")
    assert code == 0
    assert lines[0].split() == ["KEY", "STAGE", "RECIPE", "SIZE", "LAST", "USE"]
    rows = [line.split() for line in lines[1:-1]]
    assert len(rows) == len(set(alpha.values()) | set(beta.values())) == 7
    by_key = {r[0]: r for r in rows}
    trace = by_key[alpha["trace"][:12]]
    assert trace[1:3] == ["trace", "alpha,beta"]  # computed by alpha, used by beta
    assert by_key[beta["export"][:12]][1:3] == ["export", "beta"]
    entry = store.read_entry(alpha["rewrite"])
    size = human_size(sum(f.size for f in entry.outputs)).split()
    assert by_key[alpha["rewrite"][:12]][3:5] == size
    assert "(8h ago)" in " ".join(by_key[alpha["rewrite"][:12]])
    # least recently used first: alpha's export (aged 9h) before beta's fresh entries
    order = [r[0] for r in rows]
    assert order.index(alpha["export"][:12]) < order.index(beta["export"][:12])
    assert re.fullmatch(r"7 of 7 entries, .* of outputs; cache .*: .* on disk", lines[-1])

    code, lines, _ = run_cache(tmp_path, capsys, "ls", "--stage", "export", "--recipe", "beta")
    assert [line.split()[0] for line in lines[1:-1]] == [beta["export"][:12]]


def test_show_takes_a_unique_prefix(
    tmp_path: Path, store: CacheStore, capsys: pytest.CaptureFixture[str]
) -> None:
    key = keys(build(tmp_path))["rewrite"]
    code, lines, _ = run_cache(tmp_path, capsys, "show", key[:8])
    assert code == 0
    assert lines[0].split() == ["key", key]
    assert lines[1].split() == ["stage", "rewrite"]
    outputs = {line.split()[0]: line.split() for line in lines if line.startswith(("model", "rew"))}
    assert set(outputs) == {"model.onnx", "rewrite.json"}
    assert outputs["model.onnx"][-1] == "present"

    store.blob_path(store.read_entry(key).outputs[0].digest).unlink()
    _, lines, _ = run_cache(tmp_path, capsys, "show", key)
    assert any(line.endswith("MISSING") for line in lines)


def test_show_refuses_unknown_and_ambiguous_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build(tmp_path)
    code, out, err = run_cache(tmp_path, capsys, "show", "zz")
    assert (code, out) == (2, [])
    assert err.strip() == "hyperexport cache show: no cache entry has a key starting with 'zz'"
    code, out, err = run_cache(tmp_path, capsys, "show", "")
    assert code == 2
    assert "matches 4 entries" in err
    assert len(err.strip().splitlines()) == 1


# -- arguments and unusable caches -------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [
        ["gc", "--max-size", "lots"],
        ["gc", "--older-than", "7"],
        ["nope"],
        [],
        ["ls", "--bogus"],
        ["status", "no_such_recipe"],
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    code = cache_cli.main(args)
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err


def test_a_file_as_cache_dir_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "cache").write_text("not a directory")
    for command in ("ls", "verify", "gc"):
        code, _out, err = run_cache(tmp_path, capsys, command)
        assert code == 3
        assert err.strip() == (
            f"hyperexport cache {command}: cache directory {tmp_path / 'cache'} is not a directory"
        )


def test_a_missing_cache_is_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, _ = run_cache(tmp_path, capsys, "ls")
    assert code == 0
    assert lines[-1].startswith("0 of 0 entries")
    assert not (tmp_path / "cache").exists()


# -- verify ------------------------------------------------------------------------------
def test_verify_drops_corrupt_entries_and_the_next_build_heals(
    tmp_path: Path,
    store: CacheStore,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # verify judges each entry by its stage's declared outputs: these entries are the fakes'.
    monkeypatch.setattr("hyperexport.product.stages.pipeline.PIPELINE", pipeline())
    first = keys(build(tmp_path))
    rewrite = store.read_entry(first["rewrite"])
    model = next(f for f in rewrite.outputs if f.path == "model.onnx")
    blob = store.blob_path(model.digest)
    blob.chmod(0o644)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other content: only a re-hash sees it
    blob.write_bytes(bytes(data))
    check = store.read_entry(first["check"])
    store.blob_path(check.outputs[0].digest).unlink()
    garbage = "cd" * 32
    store.action_path(garbage).parent.mkdir(parents=True, exist_ok=True)
    store.action_path(garbage).write_text("{not json")

    code, lines, _ = run_cache(tmp_path, capsys, "verify")
    assert code == 1
    problems = "\n".join(lines[:-1])
    assert f"blob {model.digest[:12]}: corrupt" in problems
    assert f"entry {first['rewrite'][:12]} (rewrite, fake): dropped, blob of model.onnx" in problems
    assert (
        f"entry {first['check'][:12]} (check, fake): dropped, blob of check.json is missing"
        in problems
    )
    assert f"entry {garbage[:12]}: dropped, unreadable" in problems
    assert "1 corrupt blobs removed, 3 entries dropped" in lines[-1]
    assert_consistent(store)
    assert {k for k, _ in store.entry_paths()} == {first["trace"], first["export"]}

    code, lines, _ = run_cache(tmp_path, capsys, "verify")
    assert code == 0
    assert len(lines) == 1
    assert statuses(build(tmp_path)) == ["hit", "hit", "ran", "ran"]


# -- gc ----------------------------------------------------------------------------------
def test_gc_older_than_evicts_idle_entries_and_their_blobs(
    tmp_path: Path, store: CacheStore, capsys: pytest.CaptureFixture[str]
) -> None:
    alpha = keys(build(tmp_path, name="alpha"))
    beta = keys(build(tmp_path, name="beta", opset=16))
    only_alpha = set(alpha.values()) - set(beta.values())
    for key in only_alpha:
        age(store, key, 8 * 24 * HOUR)
    blobs_before = {d for d, _ in store.blob_paths()}

    code, lines, _ = run_cache(tmp_path, capsys, "gc", "--older-than", "7d", "--dry-run")
    assert code == 0
    assert {line.split()[2] for line in lines[:-1]} == {k[:12] for k in only_alpha}
    assert all(line.startswith("would evict") for line in lines[:-1])
    assert lines[-1].startswith("gc: would evict 3 entries; would remove ")
    assert {d for d, _ in store.blob_paths()} == blobs_before  # a dry run removes nothing

    code, lines, _ = run_cache(tmp_path, capsys, "gc", "--older-than", "7d")
    assert code == 0
    assert {k for k, _ in store.entry_paths()} == set(beta.values())
    assert_consistent(store)
    kept = {d for k in beta.values() for d in store.read_entry(k).digests().values()}
    assert {d for d, _ in store.blob_paths()} == kept  # alpha's own blobs are gone
    assert statuses(build(tmp_path, name="beta", opset=16)) == ["hit"] * 4
    assert statuses(build(tmp_path, name="alpha")) == ["hit", "ran", "ran", "ran"]


def test_gc_max_size_evicts_least_recently_used_first(
    tmp_path: Path, store: CacheStore, capsys: pytest.CaptureFixture[str]
) -> None:
    alpha = keys(build(tmp_path, name="alpha", opset=15))
    beta = keys(build(tmp_path, name="beta", opset=16))
    gamma = keys(build(tmp_path, name="gamma", opset=17))
    # alpha was used longest ago, then beta, then gamma (the shared trace: just now)
    for hours, used in ((30, alpha), (20, beta), (10, gamma)):
        for stage, key in used.items():
            if stage != "trace":
                age(store, key, hours * HOUR)
    bound = disk_usage(store.root) - 1

    code, lines, _ = run_cache(tmp_path, capsys, "gc", "--max-size", str(bound))
    assert code == 0
    assert disk_usage(store.root) <= bound
    evicted = [line.split()[1] for line in lines if line.startswith("evicted ")]
    assert evicted and set(evicted) <= {k[:12] for k in alpha.values()}
    assert_consistent(store)
    assert statuses(build(tmp_path, name="gamma", opset=17)) == ["hit"] * 4
    assert statuses(build(tmp_path, name="beta", opset=16)) == ["hit"] * 4


def test_gc_never_touches_what_was_used_within_the_grace_period(
    tmp_path: Path, store: CacheStore, capsys: pytest.CaptureFixture[str]
) -> None:
    first = keys(build(tmp_path))
    fresh_orphan = store.blob_path("ee" * 32)
    old_orphan = store.blob_path("ff" * 32)
    for orphan in (fresh_orphan, old_orphan):
        orphan.parent.mkdir(parents=True, exist_ok=True)
        orphan.write_bytes(b"written by a build that has not written its entry yet")
    stale_tmp = store.action_path(first["trace"]).with_name(".x.json.1234.tmp")
    stale_tmp.write_text("left by a killed write")
    for path in (old_orphan, stale_tmp):
        os.utime(path, (time.time() - 2 * HOUR,) * 2)

    code, lines, _ = run_cache(tmp_path, capsys, "gc", "--max-size", "0")
    assert code == 0
    assert {k for k, _ in store.entry_paths()} == set(first.values())
    assert fresh_orphan.is_file()
    assert not old_orphan.exists()
    assert not stale_tmp.exists()
    assert lines[-2] == "kept 4 entries used within the grace period (1h, --grace)"
    assert lines[-1] == "the cache is still above 0 B"
    assert "removed 1 blobs" in lines[-3] and "1 stale temporary files" in lines[-3]

    code, lines, _ = run_cache(tmp_path, capsys, "gc", "--max-size", "0", "--grace", "0")
    assert list(store.entry_paths()) == []
    assert list(store.blob_paths()) == []


def test_gc_collects_dependency_records_no_entry_uses(
    tmp_path: Path, store: CacheStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record goes with the last entry stored under a key it resolves to (issue 32)."""
    alpha = keys(build(tmp_path, name="alpha"))
    beta = keys(build(tmp_path, name="beta", opset=16))  # shares alpha's trace
    deps = store.root / "deps"
    records = sorted(deps.glob("*/*.json"))
    assert len(records) == 3  # the shared trace's, and each export's
    newer = deps / "ab" / f"{'ab' * 32}.json"  # a newer hyperexport's: never guessed at
    newer.parent.mkdir(exist_ok=True)
    newer.write_text(json.dumps({"format": 99, "sets": []}))
    week_ago = time.time() - 8 * 24 * HOUR
    for path in [*records, newer]:
        os.utime(path, (week_ago, week_ago))
    for key in set(alpha.values()) - set(beta.values()):
        age(store, key, 8 * 24 * HOUR)

    code, lines, _ = run_cache(tmp_path, capsys, "gc", "--older-than", "7d", "--dry-run")
    assert code == 0
    assert ", 1 dependency records (" in lines[-1]
    assert sorted(deps.glob("*/*.json")) == sorted([*records, newer])

    code, lines, _ = run_cache(tmp_path, capsys, "gc", "--older-than", "7d")
    assert code == 0 and ", 1 dependency records (" in lines[-1]
    left = sorted(deps.glob("*/*.json"))
    assert len(left) == 3 and newer in left  # the trace's and beta's export's stay
    assert statuses(build(tmp_path, name="beta", opset=16)) == ["hit"] * 4
    assert statuses(build(tmp_path, name="alpha")) == ["hit", "ran", "ran", "ran"]

    code, lines, _ = run_cache(tmp_path, capsys, "gc", "--max-size", "0", "--grace", "0")
    assert code == 0
    assert list(store.entry_paths()) == []
    assert sorted(deps.glob("*/*.json")) == [newer]
    assert ", 3 dependency records (" in lines[-2]


def test_retire_puts_back_a_file_used_meanwhile(tmp_path: Path) -> None:
    from hyperexport.engine.collector import retire

    path = tmp_path / "entry.json"
    path.write_text("x")
    assert retire(path, cutoff=time.time() - HOUR) is None  # touched after the cutoff
    assert path.read_text() == "x"
    assert [p.name for p in tmp_path.iterdir()] == ["entry.json"]
    assert retire(path, cutoff=time.time() + 1) == 1
    assert list(tmp_path.iterdir()) == []
    assert retire(path, cutoff=time.time()) is None  # already gone


def test_a_hit_on_an_entry_gc_removed_is_a_miss(tmp_path: Path, store: CacheStore) -> None:
    key = keys(build(tmp_path))["trace"]
    entry_path = store.action_path(key)
    # The build read the entry; gc retired it before the build recorded the hit.
    original = CacheStore.mark_used

    def gc_in_between(self: CacheStore, k: str) -> bool:
        entry_path.unlink()
        return original(self, k)

    CacheStore.mark_used = gc_in_between  # type: ignore[method-assign]
    try:
        assert store.lookup(key).status == "missing"
    finally:
        CacheStore.mark_used = original  # type: ignore[method-assign]


# Collects with the tightest bound until the stop file (argv[2]) appears; after each run it
# prints and flushes "GC RUN <n>", the event the test waits on.
GC_LOOP = """
import os, sys
from hyperexport.product.cli.cache import main
runs = 0
while not os.path.exists(sys.argv[2]):
    assert main(["gc", "--max-size", "0", "--grace", "60s", "--cache-dir", sys.argv[1]]) == 0
    runs += 1
    print("GC RUN", runs, flush=True)
print("GC DONE", runs, flush=True)
"""

#: A bound on how long one gc run may take on a loaded machine; only a hung gc reaches it.
_GC_RUN_LIMIT = 300.0


def _gc_runs(log: Path) -> int:
    """How many gc runs the loop has finished, from its log."""
    lines = [line for line in log.read_text().splitlines() if line.startswith("GC RUN ")]
    return int(lines[-1].split()[-1]) if lines else 0


def _wait_for_gc_run(gc: subprocess.Popen[bytes], log: Path, after: int) -> int:
    """Block until the gc loop has finished a run beyond ``after``; the new count."""
    deadline = time.monotonic() + _GC_RUN_LIMIT
    while (runs := _gc_runs(log)) <= after:
        assert gc.poll() is None, f"gc died: {log.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"gc hung: {log.read_text()[-2000:]}"
        time.sleep(0.05)
    return runs


def _age(root: Path, seconds: float) -> None:
    """Make every file of the cache look unused for ``seconds``."""
    past = time.time() - seconds
    for path in root.rglob("*"):
        if path.is_file():
            os.utime(path, (past, past))


# slow: builds in a loop against a gc process (72 s under load); gc's rules stay in the
# default run (the max_size, older_than and grace-period tests)
@pytest.mark.slow
def test_gc_racing_builds_never_breaks_them(tmp_path: Path, store: CacheStore) -> None:
    """Builds hit, reuse and write entries while another process collects with the tightest
    size bound. Under the documented rule (the grace period is longer than a build) gc evicts
    everything idle around them, including entries the builds share and refresh, and no build
    may fail, no entry may ever name a missing blob.

    No time window: gc runs in a loop and reports each run; every build starts after a gc run
    it has not seen yet, and gc stops when the test creates the stop file.
    """
    aged = {opset: keys(build(tmp_path, opset=opset)) for opset in (13, 14, 15)}
    _age(store.root, 3600)  # idle for an hour: gc may take all of it
    fresh = (16, 17, 18, 16, 17, 18)  # new export keys; the trace key is shared with the aged
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    log, stop = tmp_path / "gc.log", tmp_path / "gc.stop"  # a file, not a pipe
    with open(log, "w") as sink:
        gc = subprocess.Popen(
            [sys.executable, "-c", GC_LOOP, str(store.root), str(stop)],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
        seen = 0
        try:
            for opset in fresh:
                seen = _wait_for_gc_run(gc, log, seen)
                build(tmp_path, opset=opset)  # asserts exit code 0
            seen = _wait_for_gc_run(gc, log, seen)
        finally:
            stop.touch()
            gc.wait(timeout=_GC_RUN_LIMIT)
    text = log.read_text()
    assert gc.returncode == 0, text[-2000:]
    assert int(text.split()[-1]) >= len(fresh) + 1
    # gc did evict under the builds: the aged builds' own export entries are gone.
    assert all(not store.action_path(k["export"]).exists() for k in aged.values())
    assert_consistent(store)
    # and what the builds used is intact: building again is all hits
    assert statuses(build(tmp_path, opset=fresh[0])) == ["hit"] * 4


# -- with the real pipeline --------------------------------------------------------------
@pytest.fixture(scope="module")
def toy_package(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The toy model package (``hx_toy``), importable while the module's tests run."""
    with toy_package_in(tmp_path_factory.mktemp("toy")) as pkg:
        yield pkg


#: The schema's default opset, which ``TOY_RECIPE`` leaves unset (17 where torch's TorchScript
#: stops there, versions.torchscript_opset); the tests' other opsets are below it.
DEFAULT = versions.torchscript_opset(DEFAULT_OPSET)


def toy_recipe(pkg: Path, name: str = "toy", seed: int = 0, opset: int = DEFAULT) -> Recipe:
    """The toy recipe; the same fields as ``TOY_RECIPE`` below, so their keys agree."""
    return toy_package_recipe(pkg, name=name, model__seed=seed, opset=opset)


def test_gc_max_size_keeps_the_recently_used_recipe_all_hits(
    toy_package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Acceptance: two recipes in one cache; gc to a bound that cannot hold both; the recipe
    built last is still all hits, the other one rebuilds."""
    older = toy_recipe(toy_package, name="toy_a", opset=16)
    newer = toy_recipe(toy_package, name="toy_b", seed=1)
    assert real_build(older, tmp_path).exit_code == 0
    assert real_build(newer, tmp_path).exit_code == 0
    root = tmp_path / "cache"
    bound = disk_usage(root) - 1

    code, lines, _ = run_cache(tmp_path, capsys, "gc", "--max-size", str(bound), "--grace", "0")
    assert code == 0, lines
    assert disk_usage(root) <= bound
    evicted = {line.split()[3] for line in lines if line.startswith("evicted ")}
    assert evicted == {"toy_a"}
    assert_consistent(CacheStore(root))
    assert set(real_statuses(real_build(newer, tmp_path)).values()) == {"hit"}
    assert "ran" in real_statuses(real_build(older, tmp_path)).values()


# Runs ``cache`` once per argument list (JSON in argv[1]), then reports the heavy imports.
STATUS_PROBE = f"""
import json, sys
from hyperexport.product.cli.cache import main
codes = [main(args) for args in json.loads(sys.argv[1])]
print("PROBE " + json.dumps({{"codes": codes, "heavy": sorted(m for m in {HEAVY!r} if m in sys.modules)}}))
"""


def test_status_says_what_would_run_and_why_without_torch(
    toy_package: Path, tmp_path: Path
) -> None:
    assert real_build(toy_recipe(toy_package), tmp_path).exit_code == 0
    recipe_file = tmp_path / "toy.yaml"
    recipe_file.write_text(TOY_RECIPE)
    cache_dir = ["--cache-dir", str(tmp_path / "cache")]
    runs = [
        ["status", "--recipe-file", str(recipe_file), *cache_dir],
        ["status", "--recipe-file", str(recipe_file), "--override", "opset=16", *cache_dir],
        ["status", "tiny_llama", "llama", *cache_dir],
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(toy_package.parent), *sys.path])}
    proc = subprocess.run(
        [sys.executable, "-c", STATUS_PROBE, json.dumps(runs)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    probe = next(x for x in proc.stdout.splitlines() if x.startswith("PROBE "))
    assert json.loads(probe.removeprefix("PROBE ")) == {"codes": [0, 0, 0], "heavy": []}, (
        proc.stderr
    )
    tables = [t.strip().splitlines() for t in proc.stdout.split("RECIPE")[1:]]
    assert [line.split() for line in tables[0][1:7]] == [
        ["toy", stage, "hit"]
        for stage in ("trace", "export", "rewrite", "quantize", "evaluate", "check")
    ]
    assert tables[0][7] == f"1 of 1 recipes up to date, 0 invalid; cache {tmp_path / 'cache'}"
    assert [line.split()[:3] for line in tables[1][1:3]] == [
        ["toy", "trace", "hit"],
        ["toy", "export", "would"],
    ]
    assert tables[1][2].endswith(f"would run  opset {DEFAULT}→16")
    assert [line.split()[0] for line in tables[2][1:13]] == ["tiny_llama"] * 6 + ["llama"] * 6
    assert tables[2][1].split()[1:] == ["trace", "would", "run", "no", "previous", "build"]
    assert not (tmp_path / "outputs" / "tiny_llama").exists()


def test_status_reports_an_invalid_recipe_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(TOY_RECIPE.replace("seed: 0", "seed: 0\n  nonsense: ["))
    code, lines, _ = run_cache(tmp_path, capsys, "status", "--recipe-file", str(bad))
    assert code == 2
    assert lines[1].split()[:3] == ["bad", "-", "invalid"]
    assert lines[-1].startswith("0 of 1 recipes up to date, 1 invalid")


@pytest.mark.slow
def test_gc_acceptance_with_tiny_llama_opsets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's acceptance on the embedded recipe: opset 17 and 18 share the trace; gc to a
    bound below both keeps the last one built all hits."""
    from hyperexport.product.config import compose_recipe
    from hyperexport.product.stages import PIPELINE, model_loader

    def real(opset: int) -> list[str]:
        recipe, settings = compose_recipe(["recipe=tiny_llama", f"opset={opset}"])
        settings = BuildSettings(str(tmp_path / "cache"), tmp_path / "outputs", False, ())
        outcome = run_build(
            recipe,
            settings,
            stages=PIPELINE,
            load_model=model_loader(recipe),
            variant=f"opset={opset}",
        )
        assert outcome.exit_code == 0, outcome.lines
        return statuses(outcome)

    assert real(17) == ["ran"] * 6
    assert real(18) == ["hit", "ran", "ran", "ran", "ran", "ran"]
    root = tmp_path / "cache"
    bound = disk_usage(root) - 1
    code, _lines, _ = run_cache(tmp_path, capsys, "gc", "--max-size", str(bound), "--grace", "0")
    assert code == 0
    assert disk_usage(root) <= bound
    assert_consistent(CacheStore(root))
    assert real(18) == ["hit"] * 6
    assert real(17)[0] == "hit"  # the shared trace was used last, so it was kept


def test_python_m_hyperexport_cache_dispatches(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    base = [sys.executable, "-m", "hyperexport", "cache"]
    ok = subprocess.run(
        [*base, "ls", "--cache-dir", str(tmp_path)], env=env, capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines()[-1].startswith("0 of 0 entries")
    bad = subprocess.run([*base, "gc", "--max-size", "x"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1


HOLD_SCRATCH = """
import sys, time
from pathlib import Path
from hyperexport.engine.store import CacheStore
with CacheStore(Path(sys.argv[1])).scratch("build-") as path:
    (path / "partial.onnx").write_bytes(bytes(4096))
    print(path, flush=True)
    time.sleep(600)
"""


def test_gc_removes_the_scratch_of_a_killed_build_only(
    tmp_path: Path, store: CacheStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """The build's own liveness rule (engine/process_locks.py): a scratch folder whose lock is held
    belongs to a running build, however old; once its build is killed, gc removes it."""
    build(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_SCRATCH, str(store.root)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        scratch = Path(holder.stdout.readline().strip())
        os.utime(scratch, (time.time() - 48 * HOUR,) * 2)  # age alone never makes it dead
        code, lines, _ = run_cache(tmp_path, capsys, "gc", "--grace", "0")
        assert code == 0
        assert "0 scratch folders of dead builds" in lines[-1]
        assert (scratch / "partial.onnx").is_file()
    finally:
        holder.kill()
        holder.wait(timeout=60)
    code, lines, _ = run_cache(tmp_path, capsys, "gc", "--dry-run")
    assert "1 scratch folders of dead builds (4.0 KiB)" in lines[-1]
    assert scratch.is_dir()
    code, lines, _ = run_cache(tmp_path, capsys, "gc")
    assert code == 0
    assert "1 scratch folders of dead builds (4.0 KiB)" in lines[-1]
    assert not scratch.exists()
    assert_consistent(store)
    assert statuses(build(tmp_path)) == ["hit"] * 4
