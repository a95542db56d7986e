"""Keys are a function of content: two machines with one stack key one build alike (issue 32).

Nothing of the machine may enter a key: the paths of the virtualenv, the checkout, the cache and
the outputs, ``HOME``, ``TMPDIR``, the user name, the host name, the order in which distributions
were installed. Each differs between the two machines below. The recipe names a model from an
installed distribution, which imports another; both install console scripts naming each
virtualenv's Python. Every stage key, and every published byte, must be equal.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import machines as m


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[m.Machine, m.Machine]]:
    root = tmp_path_factory.mktemp("machines")
    sources = [m.write_distribution(root / "src", name) for name in sorted(m.DISTRIBUTIONS)]
    first = m.Machine(root / "a", "ana")
    second = m.Machine(root / "second-machine" / "deeper", "bartholomew")
    for machine, order in ((first, sources), (second, sources[::-1])):  # install order differs
        m.make_venv(machine, system_site_packages=True)  # the heavy stack: this interpreter's
        m.install_distributions(machine, order)
        m.copy_checkout(machine)
        m.write_user(machine)
    yield first, second


def test_two_machines_key_and_publish_one_build_alike(
    two: tuple[m.Machine, m.Machine], tmp_path: Path
) -> None:
    first, second = two
    warm = Path.home() / ".cache" / "hyperexport"  # compiled files only (keyed_imports.py)
    host = None if m.can_rename_host() else "second-host"
    a = m.build_here(first, bytecode_home=warm)
    assert a.returncode == 0, a.stderr[-2000:]
    b = m.build_here(second, bytecode_home=warm, hostname=host)
    assert b.returncode == 0, b.stderr[-2000:]
    keys_a, keys_b = m.stage_keys(first), m.stage_keys(second)
    assert set(keys_a) == {"trace", "export", "rewrite", "quantize", "evaluate", "check"}
    assert keys_a == keys_b
    assert m.published(first) == m.published(second)
    for machine in two:  # and no path of either machine is written into a key's record
        for record in (machine.cache / "runs").rglob("*.json"):
            text = record.read_text()
            assert str(machine.root) not in text and machine.user_name not in text, record


def test_the_host_name_can_be_changed_here() -> None:
    """The test above varies the host name only where a UTS namespace can be made."""
    reason = m.can_rename_host()
    if reason is not None:
        pytest.skip(f"the host name was not varied: {reason}")


@pytest.mark.slow
def test_one_remote_serves_a_machine_with_its_own_virtualenv(tmp_path: Path) -> None:
    """Build on machine A with a full virtualenv of the pinned stack, uploading to a shared
    remote; machine B, with its own full virtualenv and checkout at other paths, pulls: every
    stage hits, and what it publishes is byte for byte A's. Two installs of the stack (a few
    minutes each), hence slow; README "CI" and docs/cache.md document it."""
    remote = tmp_path / "remote"
    remote.mkdir()
    sources = [m.write_distribution(tmp_path / "src", name) for name in sorted(m.DISTRIBUTIONS)]
    machines = (m.Machine(tmp_path / "a", "ana"), m.Machine(tmp_path / "b" / "elsewhere", "bo"))
    for machine in machines:
        m.make_venv(machine, system_site_packages=False)
        m.copy_checkout(machine)
        constraints = machine.checkout / "constraints.txt"
        m.pip(machine, "-c", str(constraints), "-e", f"{machine.checkout}[dev]", timeout=1800)
        m.install_distributions(machine, sources)
        m.write_user(machine)
    first, second = machines
    shared = f"build.remote=file://{remote}"
    a = m.build_here(first, shared)
    assert a.returncode == 0, a.stderr[-2000:]
    b = m.build_here(second, shared)
    assert b.returncode == 0, b.stderr[-2000:]
    statuses = {s["name"]: s["status"] for s in m.report(second)["stages"]}
    assert set(statuses.values()) == {"hit"}, statuses
    assert m.stage_keys(first) == m.stage_keys(second)
    assert m.published(first) == m.published(second)
