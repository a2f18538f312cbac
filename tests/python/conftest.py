"""The package under test comes from the build tree (PYTHONPATH=<build>/python, set by ctest) or
an installed sketchsgd; the DDP helpers sit beside the tests."""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
try:
    import sketchsgd  # noqa: F401
except ImportError:
    build = os.path.join(here, "..", "..", "build", "default", "python")
    sys.path.insert(0, os.path.abspath(build))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.abspath(build), here, os.environ.get("PYTHONPATH")]))
else:
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
