"""docs/configuration.md against each binary's --help (issue #54: the flag reference drifted): every flag a binary
takes is named on the page, and every flag the page's tables give a binary (its "where" column) is one it takes."""
import re
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, binary

DOC = REPO / "docs" / "configuration.md"
BINARIES = {"launch": "ferry-launch", "gateway": "ferry-gateway", "scheduler": "ferry-scheduler", "worker": "ferry-worker"}


def flags_of(name):
    out = subprocess.run([str(binary(name)), "--help"], capture_output=True, text=True, timeout=30).stdout
    flags = set(re.findall(r"^\s+(?:-\w, )?--([a-z][a-z0-9-]+)", out, re.M))
    flags |= set(re.findall(r",--([a-z][a-z0-9-]+)", out))  # a --x,--no-x pair
    assert len(flags) > 10, out
    return flags


def named_on_the_page(text):
    """--flag, and --[no-]flag as both forms."""
    names = set(re.findall(r"--([a-z][a-z0-9-]+)", text))
    for stem in re.findall(r"--\[no-\]([a-z][a-z0-9-]+)", text):
        names |= {stem, "no-" + stem}
    return names


@pytest.mark.parametrize("where", sorted(BINARIES))
def test_every_flag_of_the_binary_is_on_the_page(where):
    missing = sorted(flags_of(BINARIES[where]) - named_on_the_page(DOC.read_text()) - {"help"})
    assert not missing, f"{BINARIES[where]} takes flags docs/configuration.md does not name: {missing}"


def table_rows():
    """(flags named in the row's first column, the binaries of its "where" column) of every flag table."""
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) < 3 or not cells[0].startswith("`--"):
            continue
        wheres = [w.strip() for w in cells[1].split(",")]
        yield named_on_the_page(cells[0]), [w for w in wheres if w in BINARIES]


def test_every_flag_the_tables_give_a_binary_is_its_own():
    taken = {where: flags_of(name) for where, name in BINARIES.items()}
    rows = list(table_rows())
    assert len(rows) > 30
    wrong = []
    for flags, wheres in rows:
        for where in wheres:
            # A row may name several flags for several binaries; each flag must belong to one of them.
            for flag in flags:
                if not any(flag in taken[w] for w in wheres):
                    wrong.append(f"--{flag} ({', '.join(wheres)})")
    assert not wrong, f"docs/configuration.md names flags its binaries do not take: {sorted(set(wrong))}"


def help_text(name):
    return " ".join(subprocess.run([str(binary(name)), "--help"], capture_output=True, text=True,
                                   timeout=30).stdout.split())


@pytest.mark.parametrize("flag, owners", [("step-timeout-s", ["ferry-scheduler", "ferry-worker"]),
                                          ("worker-recovery-timeout-s", ["ferry-scheduler"])])
def test_ferry_launchs_documented_defaults_are_the_binaries(flag, owners):
    """ferry-launch forwards the flag only when given, so the default it documents must be its owners' (#54: the
    worker's step timeout defaulted to 0 while ferry-launch said 60)."""
    launch = re.search(rf"--{flag} (?:(?!--).)*?default (\d+)\)", help_text("ferry-launch"))
    assert launch, f"ferry-launch --help states no default for --{flag}"
    for owner in owners:
        own = re.search(rf"--{flag} (?:(?!--).)*?=([\d.]+) ", help_text(owner))
        assert own, f"{owner} --help shows no default for --{flag}"
        assert float(own.group(1)) == float(launch.group(1)), (flag, owner, own.group(1), launch.group(1))


def controller_modes(name):
    found = re.search(r"--controller-mode TEXT:\{([a-z,-]+)\}", help_text(name))
    assert found, f"{name} --help lists no --controller-mode values"
    return set(found.group(1).split(","))


def test_the_controller_modes_are_the_registrys_everywhere():
    """One registry of cap modes (scheduler/cap/modes/registry.cc): ferry-scheduler, ferry-sim and ferry-launch
    take exactly its names, and the page names every one of them (#54: the names were listed in three files)."""
    modes = controller_modes("ferry-scheduler")
    assert {"static", "load-level", "goodput"} <= modes
    assert controller_modes("ferry-sim") == modes
    assert controller_modes("ferry-launch") == modes
    row = next(line for line in DOC.read_text().splitlines() if line.startswith("| `--controller-mode "))
    for mode in modes:
        assert f"`{mode}`" in row, f"docs/configuration.md's --controller-mode row does not name {mode}"
