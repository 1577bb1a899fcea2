"""The simulated agent prints what the real CLIs print: same line types, same keys, same JSON types.

Both CLIs run with the argv and environment the product's plugins build, once
for real (image orchestrator-fidelity, scripted API in the container) and once
as the simulated agent (image orchestrator-test-agent), for the same four
scenarios: success, a resumed session, a persistent 429 and a 401. Each
printed line is reduced to its shape: its line type (``type``, ``subtype``,
an item's ``type``) and the paths and JSON types of its keys, two levels deep.

Any difference fails: a line type or a key (with its JSON type) that only
one side prints. Fix the simulated agent (docker/sim_agent) to print what the
real CLI prints; values may stay simulated.
"""

from __future__ import annotations

import pytest
from conftest import TEST_IMAGE
from fidelity_helpers import ensure_image
from shape_drift import REAL, capture, drift

pytestmark = [pytest.mark.docker, pytest.mark.fidelity]
# The same steps the scripted API asks the real CLIs for: write, commit, edit, commit.
SIM = {
    "success": "SIM: write notes.txt first line\nSIM: commit fidelity: add notes.txt\n"
    "SIM: edit notes.txt first line => edited line\nSIM: commit fidelity: edit notes.txt\nSIM: print done",
    "resume": "SIM: print done again",
    "429": "SIM: ratelimit 1",
    "401": "SIM: authfail",
}


@pytest.fixture(scope="module")
def fidelity_image():
    return ensure_image()


@pytest.mark.parametrize("plugin", ["claude-code", "codex"])
def test_sim_agent_prints_the_shapes_the_real_cli_prints(fidelity_image, plugin):
    real = capture(fidelity_image, plugin, REAL)
    sim = capture(TEST_IMAGE, plugin, SIM)
    found = drift(real, sim)
    assert not found, "the simulated agent drifted from the real CLI:\n" + "\n".join(found)
