"""SWE-bench's log parser names (the ``log_parser`` of rows in its current format), as data.

From SWE-bench's harness (``swebench/harness/log_parsers``: ``PARSER_REGISTRY`` and the
per-repository aliases of ``MAP_REPO_TO_PARSER_PY``, swebench 5.0.2): the name, the farm
format that reads the same runner's output, and how that parser lists test ids
(``farm.grading.parsers.ids``).
"""

from __future__ import annotations

from farm.grading.parsers.base import IdRule

# name -> (farm format, id rule)
PYTHON: dict[str, tuple[str, IdRule]] = {
    "parse_log_pytest": ("pytest", IdRule.CUT),  # pytest-dev/pytest
    "parse_log_astroid": ("pytest", IdRule.CUT),  # pylint-dev/astroid
    "parse_log_flask": ("pytest", IdRule.CUT),  # pallets/flask
    "parse_log_marshmallow": ("pytest", IdRule.CUT),  # marshmallow-code/marshmallow
    "parse_log_pvlib": ("pytest", IdRule.CUT),  # pvlib/pvlib-python
    "parse_log_pyvista": ("pytest", IdRule.CUT),  # pyvista/pyvista
    "parse_log_sqlfluff": ("pytest", IdRule.CUT),  # sqlfluff/sqlfluff
    "parse_log_xarray": ("pytest", IdRule.CUT),  # pydata/xarray
    "parse_log_pytest_options": ("pytest", IdRule.OPTIONS),
    "parse_log_pydicom": ("pytest", IdRule.OPTIONS),  # pydicom/pydicom
    "parse_log_requests": ("pytest", IdRule.OPTIONS),  # psf/requests
    "parse_log_pylint": ("pytest", IdRule.OPTIONS),  # pylint-dev/pylint
    "parse_log_pytest_v2": ("pytest", IdRule.FULL),
    "parse_log_astropy": ("pytest", IdRule.FULL),  # astropy/astropy
    "parse_log_scikit": ("pytest", IdRule.FULL),  # scikit-learn/scikit-learn
    "parse_log_sphinx": ("pytest", IdRule.FULL),  # sphinx-doc/sphinx
    "parse_log_matplotlib": ("pytest", IdRule.MATPLOTLIB),  # matplotlib/matplotlib
    "parse_log_seaborn": ("pytest", IdRule.SEABORN),  # mwaskom/seaborn
    "parse_log_django": ("django", IdRule.EXACT),  # django/django
    "parse_log_sympy": ("sympy", IdRule.EXACT),  # sympy/sympy
}

# SWE-bench Multilingual / Multimodal runners: known names, formats farm does not read.
OTHER_LANGUAGES: dict[str, str] = {
    **dict.fromkeys(
        ["parse_log_calypso", "parse_log_chart_js", "parse_log_marked", "parse_log_p5js", "parse_log_react_pdf",
         "parse_log_jest", "parse_log_jest_json", "parse_log_vitest", "parse_log_karma", "parse_log_tap",
         "parse_log_immutable_js", "parse_log_bpmn_js", "parse_log_carbon", "parse_log_eslint", "parse_log_grommet",
         "parse_log_highlightjs", "parse_log_lighthouse", "parse_log_next", "parse_log_openlayers",
         "parse_log_prismjs", "parse_log_quarto_cli"],
        "JavaScript",
    ),
    **dict.fromkeys(
        ["parse_log_redis", "parse_log_jq", "parse_log_doctest", "parse_log_micropython_test",
         "parse_log_googletest"],
        "C/C++",
    ),
    "parse_log_gotest": "Go",
    **dict.fromkeys(["parse_log_maven", "parse_log_ant", "parse_log_gradle_custom"], "Java"),
    "parse_log_phpunit": "PHP",
    **dict.fromkeys(
        ["parse_log_minitest", "parse_log_cucumber", "parse_log_ruby_unit", "parse_log_rspec_transformed_json",
         "parse_log_jekyll"],
        "Ruby",
    ),
    "parse_log_cargo": "Rust",
}  # fmt: skip
