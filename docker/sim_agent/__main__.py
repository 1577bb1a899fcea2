"""``python3 docker/sim_agent --as claude ...``: run the package from a source checkout."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))

from sim_agent.main import entry

entry()
