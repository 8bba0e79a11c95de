"""Telling a broken environment from what a diff did: the causes ``diagnose`` names, and
the runtime finding a run that never finished raises only when it claims success."""

from __future__ import annotations

from farm.grading.environment import diagnose, diff_brings, left_out_note, network_note, removed_numpy_note
from farm.grading.hacks import runtime_flags
from farm.grading.probe import ProbeReport

CONFTEST_IMPORT = """ImportError while loading conftest '/workspace/repo/tests/conftest.py'.
tests/conftest.py:1: in <module>
    import numpy
E   ModuleNotFoundError: No module named 'numpy'
"""


def test_the_causes_in_the_environment_are_named():
    assert "lacks module(s) the tests import: numpy" in diagnose(exit_code=4, text=CONFTEST_IMPORT, repo_names=["pkg"])
    assert "pytest is not installed" in diagnose(exit_code=1, text="/r/.venv/bin/python: No module named pytest")
    assert "program is missing (exit 127)" in diagnose(exit_code=127, text="sh: 1: .venv/bin/python: not found\n")
    refused = diagnose(exit_code=4, text="ERROR: usage: __main__.py [options]\n__main__.py: error: unrecognized arguments: -n\n")
    assert refused and "pytest refuses" in refused


def test_what_the_code_lacks_is_not_the_environment():
    own = "E   ModuleNotFoundError: No module named 'pkg.newmodule'\n"
    assert diagnose(exit_code=2, text=own, repo_names=["pkg", "tests"]) is None  # the fix's to provide
    assert diagnose(exit_code=2, text="E   SyntaxError: invalid syntax\n") is None
    assert diagnose(exit_code=-9, text="") is None  # killed: not a named cause
    assert diagnose(exit_code=0, text=CONFTEST_IMPORT) is None
    diff = "diff --git a/pkg/a.py b/pkg/a.py\n--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -1 +1,2 @@\n x = 1\n+import numpy\n"
    assert diff_brings(diff, "the environment lacks module(s) the tests import: numpy")
    assert not diff_brings(diff, "the environment lacks module(s) the tests import: scipy")


def test_an_unfinished_run_is_a_finding_only_when_it_claims_success():
    unfinished = ProbeReport(present=True)
    common = {"pytest_task": True, "watched": ["t::a"], "f2p": ["t::a"]}
    assert runtime_flags(unfinished, printed={"t::a": "PASSED"}, exit_code=0, **common) == ["runtime:report_missing"]
    assert runtime_flags(unfinished, printed={"t::a": "PASSED"}, exit_code=1, **common) == ["runtime:report_missing"]
    assert runtime_flags(unfinished, printed={}, exit_code=4, **common) == []  # a conftest that failed: no claim
    assert runtime_flags(ProbeReport(), printed={}, exit_code=0, **common) == ["runtime:report_missing"]  # pytest shadowed


def test_a_failure_on_a_missing_module_names_what_the_setup_left_out():
    log = "E   ModuleNotFoundError: No module named 'cdms2'\n"
    note = left_out_note(log, ["cdms2: not on PyPI", "hdf5: not on PyPI"])
    assert note == ("; it failed on missing module(s) cdms2, and the environment's setup left out "
                    "cdms2: not on PyPI; hdf5: not on PyPI")
    assert left_out_note(log, []) == "" and left_out_note("E   assert 1 == 2\n", ["cdms2: not on PyPI"]) == ""


def test_tests_that_reach_the_internet_are_named():
    """sphinx's linkcheck tests check links on the internet: offline they fail, and the row's
    reason says why (what SWE-bench's harness had, a sandbox has not)."""
    log = ("links.txt:10: [broken] https://www.google.com/#!bar: HTTPSConnectionPool(host='www.google.com', port=443): "
           "Max retries exceeded (Caused by NewConnectionError(': Failed to establish a new connection: "
           "[Errno -3] Temporary failure in name resolution'))\nsee https://docs.example.org/x for help\n")
    assert network_note(log) == ("; its tests reach hosts on the internet (www.google.com) (Temporary failure in name "
                                 "resolution): a grading sandbox has no network, SWE-bench's harness ran them online")
    assert network_note("E   assert 1 == 2\n") == ""
    # pydicom 2 downloads its tests' data files when they are not in the checkout, and only warns
    # when it cannot: the test fails reading None, pytest's warnings summary says why
    pydicom = ("pydicom/tests/test_handler_util.py::TestNumpy_ConvertColourSpace::test_rgb_ybr_rgb_single_frame\n"
               "  /testbed/pydicom/data/data_manager.py:352: UserWarning: A download failure occurred while attempting "
               "to retrieve SC_rgb.dcm\n    warnings.warn(\n")  # fmt: skip
    assert network_note(pydicom) == ("; its tests reach hosts on the internet (download failure occurred while "
                                     "attempting to retrieve SC_rgb.dcm): a grading sandbox has no network, SWE-bench's "
                                     "harness ran them online")


def test_code_using_a_name_numpy_removed_is_named():
    """pydicom__pydicom-1236: its gold patch (2020) uses np.float, which numpy 1.24 removed; the
    row's reason says so and what to do, not only which tests failed."""
    log = ("pydicom/pixel_data_handlers/util.py:673: in _convert_RGB_to_YBR_FULL\n    dtype=np.float\n"
           "E           AttributeError: module 'numpy' has no attribute 'float'.\n"
           "E           AttributeError: module 'numpy' has no attribute 'float'.\n"
           "E   AttributeError: module 'numpy' has no attribute 'int'\n")
    assert removed_numpy_note(log) == (
        "; its code uses np.float, np.int, which the environment's numpy no longer has (the builtin aliases went in "
        "numpy 1.24, more names in 2.0): the row was made with an earlier numpy; pin one for this version in a "
        "recipe file (tasks.recipes)")
    assert removed_numpy_note("AttributeError: module 'pandas' has no attribute 'float'\nE   assert 1 == 2\n") == ""
