"""The package under test and the modules of examples/, scripts/ and benchmarks/ are found through
PYTHONPATH (set by ctest) or the project's environment (scripts/venv.sh puts them on .venv's
path); the DDP helpers sit beside the tests, where pytest looks first. Processes the tests start
find the helpers through PYTHONPATH."""
import os

here = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
