"""What a test is, fixed before any of the repository's code runs; and the comparisons in
the tests, checked as they run. Data to farm: copied into the grading sandbox (part of
the probe), never imported by farm.

The grader names the test files that decide the reward (the files of the FAIL_TO_PASS /
PASS_TO_PASS ids, the test patch's files) in ``config.json``. Then:

1. when the probe is imported (before any conftest or test module, so before any of the
   repository's code), their bytes are read: the files as the grader reset them;
2. in ``pytest_load_initial_conftests`` (still before any conftest), each is compiled from
   those bytes, with pytest's own assertion rewriting (or plainly, when pytest runs with
   ``--assert=plain``) and one more rewrite: every ``==``, ``!=``, ``in`` and ``not in``
   inside the tests' functions goes through ``@farm_cmp`` (a builtin the probe adds), which
   answers exactly as the comparison would and shows the operands to the probe (so
   ``assertTrue(a == b)``, ``assert all(x == y ...)`` and comparisons in helpers are seen,
   not only the top of an ``assert``);
3. pytest is handed those code objects when it imports the files (its own compile is
   skipped: ``_rewrite_test`` / ``SourceFileLoader.get_code``; no ``.pyc`` is written for
   them), so the code the tests run is the code fixed in 2, and the probe knows each
   test's code object by its place in the file (``Class::name``), whatever an item holds
   when its call starts.

A file pytest imported some other way (its compile replaced by the code under test) is
"missing": its tests' code was not the one fixed. The fixed code lives in a suspended
generator's locals (``_vault``), which no code reads without an audited operation.
"""

import _ast
import builtins
import dis
import os
import sys
import types

CMP = "@farm_cmp"  # not an identifier: no source can name it; the rewritten tests load it from builtins
_CO_LAZY = 0x20 | 0x80 | 0x100 | 0x200  # generator, coroutine, iterable coroutine, async generator
_OPS = {_ast.Eq: "==", _ast.NotEq: "!=", _ast.In: "in", _ast.NotIn: "not in"}
_RETURNS = frozenset(dis.opmap[n] for n in ("RETURN_VALUE", "RETURN_CONST") if n in dis.opmap)
# Python < 3.8 ends a return inside try/with on these too: no telling there
_UNSURE = frozenset(dis.opmap[n] for n in ("END_FINALLY", "WITH_CLEANUP_FINISH", "POP_BLOCK") if n in dis.opmap) \
    if sys.version_info < (3, 8) else frozenset()


def read_snapshot(config):
    """path (absolute, as given) -> bytes of each test file the grader named."""
    workdir = config.get("workdir") or os.getcwd()
    out = {}
    for rel in config.get("tests") or ():
        path = os.path.abspath(os.path.join(workdir, rel))
        try:
            with open(path, "rb") as fh:
                out[path] = fh.read()
        except OSError:
            continue
    return out


# --- the comparison rewrite (C-level ast types only: nothing the code under test can patch) ---

def _const(value):
    node = _ast.Constant(value) if sys.version_info >= (3, 8) else _ast.Str(value)
    return node


def _located(node, like):
    for attr in ("lineno", "col_offset", "end_lineno", "end_col_offset"):
        if hasattr(like, attr):
            setattr(node, attr, getattr(like, attr))
    return node


def _rewrite_compare(node):
    name = _located(_ast.Name(CMP, _ast.Load()), node)
    call = _ast.Call(name, [_located(_const(_OPS[type(node.ops[0])]), node), node.left, node.comparators[0]], [])
    return _located(call, node)


def _walk(node, inside):
    """Rewrite the single ``==``/``!=``/``in``/``not in`` comparisons under ``node`` that
    sit inside a function body (``inside``); module and class level code is left alone."""
    for field in node._fields:
        value = getattr(node, field, None)
        body = inside or (field == "body" and isinstance(node, (_ast.FunctionDef, _ast.AsyncFunctionDef, _ast.Lambda)))
        if isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, _ast.AST):
                    value[i] = _visit(item, body)
        elif isinstance(value, _ast.AST):
            setattr(node, field, _visit(value, body))


def _visit(node, inside):
    _walk(node, inside)
    if inside and isinstance(node, _ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _OPS:
        return _rewrite_compare(node)
    return node


def _compile(source, path, rewrite_asserts=None, config=None, _compile=compile):
    """The module's code: parsed, asserts rewritten by pytest (when given), comparisons
    rewritten, compiled as pytest / importlib would."""
    tree = _compile(source, path, "exec", _ast.PyCF_ONLY_AST, True)
    if rewrite_asserts is not None:
        names = rewrite_asserts.__code__.co_varnames[: rewrite_asserts.__code__.co_argcount]
        if "source" in names:  # pytest >= 5
            rewrite_asserts(tree, source, path, config)
        else:  # pytest < 5 names the module by a py.path
            import py

            rewrite_asserts(tree, py.path.local(path), config)
    _walk(tree, False)  # the new nodes take the locations of the comparisons they replace
    return _compile(tree, path, "exec", 0, True)


# --- the vault: the fixed code, where only an audited read reaches it ------------------------

def _index(module_code):
    """(Class, ..., name) -> [code objects] of every function and class body in the module."""
    index, every = {}, [module_code]
    stack = [(module_code, ())]
    while stack:
        code, prefix = stack.pop()
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                every.append(const)
                path = prefix + (const.co_name,)
                index.setdefault(path, []).append(const)
                stack.append((const, path))
    return index, every


def _vault(snapshot, _compile=_compile, _index=_index, _stat=os.stat, _id=id, _str=str, _tuple=tuple, _type=type,
           _code=types.CodeType, _set=set):
    """Queries: ("precompile", rewrite_asserts, config) before any repository code runs;
    ("serve", path, kind) -> the code pytest is to run for a file (None: not ours);
    ("expect", path, parts) -> (status, codes) for a test; ("ours", code) -> bool;
    ("test_code", code or file name) -> bool. A bad query gets None; the vault stays."""
    by_file = {}  # (device, inode) -> the snapshot's path: the files as they are, whatever path names them
    for path in snapshot:
        try:
            st = _stat(path)
            by_file[st.st_dev, st.st_ino] = path
        except OSError:
            continue
    real = {}  # a path as pytest names it -> the snapshot's path (or None)
    compiled = {}  # (path, kind) -> module code
    failed = _set()  # files that did not compile here: judged as before, by what the item holds
    served = {}  # path -> module code pytest was handed
    indexes = {}  # path -> index
    test_ids = _set()
    keep = []  # the codes whose ids are in test_ids stay alive

    def which(path):
        if _type(path) is not _str:  # callers pass text: no object's own __str__ runs in here
            return None
        if path not in real:
            try:
                st = _stat(path)
                real[path] = by_file.get((st.st_dev, st.st_ino))
            except OSError:
                real[path] = None
        return real[path]

    def serve(path, kind):
        if path is None or path in failed:
            return None
        code = compiled.get((path, kind))
        if code is None and kind == "plain":
            try:
                code = compiled[path, "plain"] = _compile(snapshot[path], path)
            except Exception:  # noqa: BLE001 - a syntax error fails in pytest's own import too
                failed.add(path)
                return None
        if code is not None:
            served[path] = code
            index, every = _index(code)
            indexes[path] = index
            keep.append(every)
            test_ids.update(_id(c) for c in every)
        return code

    def answer(query):
        op = query[0]
        if op == "precompile":
            for path, source in snapshot.items():
                try:
                    if query[1] is not None:
                        compiled[path, "rewrite"] = _compile(source, path, query[1], query[2])
                    else:
                        compiled[path, "plain"] = _compile(source, path)
                except Exception:  # noqa: BLE001 - a syntax error fails in pytest's own import too
                    failed.add(path)
            return None
        if op == "serve":
            return serve(which(query[1]), query[2])
        if op == "expect":
            path = which(query[1])
            if path is None or path in failed:
                return None, ()
            if path not in served:
                return "missing", ()
            codes = indexes[path].get(_tuple(query[2]))
            return ("fixed", _tuple(codes)) if codes else ("unknown", ())
        if op == "ours":
            return _id(query[1]) in test_ids
        if op == "test_code":
            what = query[1]
            if _type(what) is _code:
                return _id(what) in test_ids
            return which(what) is not None
        return None

    result = None
    while True:
        try:
            query = yield result
        except BaseException:  # noqa: BLE001 - thrown into: the vault stays (and its frame out of any traceback)
            query = (None,)
        try:
            result = answer(query)
        except Exception:  # noqa: BLE001 - a bad query gets no answer; the vault stays
            result = None


def install(snapshot, check, current):
    """Start the vault, add ``@farm_cmp`` (``check(op, a, b)`` sees the operands while a
    test's call runs: ``current[0]`` is not None), and hand pytest the fixed code.
    Returns ``(ask, precompile)``: ``ask(query)`` talks to the vault."""
    vault = _vault(snapshot)
    next(vault)
    names = {os.path.basename(p) for p in snapshot}

    def ask(query, _send=vault.send):
        return _send(query)

    plain = frozenset({int, float, str, bytes, bool, type(None)})

    def _cmp(op, a, b, _type=type):
        if op == "==":
            answer = a == b
        elif op == "!=":
            answer = a != b
        elif op == "in":
            answer = a in b
        else:
            answer = a not in b
        if current[0] is not None and (_type(a) not in plain or _type(b) not in plain):
            check(op, a, b)
        return answer

    setattr(builtins, CMP, _cmp)
    if snapshot:
        _hand_over(ask, names)

    def precompile(early_config):
        rewrite_asserts = None
        mode = getattr(getattr(early_config, "known_args_namespace", None), "assertmode", "rewrite")
        if mode == "rewrite":
            try:
                from _pytest.assertion.rewrite import rewrite_asserts  # the task's pytest, once it runs
            except ImportError:
                rewrite_asserts = None
        ask(("precompile", rewrite_asserts, early_config))

    return ask, precompile


def _hand_over(ask, names):
    """Make pytest's assertion-rewriting import and importlib's source loader run the
    fixed code for the snapshot's files (and read or write no .pyc for them)."""
    try:
        import _pytest.assertion.rewrite as rewrite  # the task's pytest, once it runs
    except ImportError:  # pragma: no cover - pytest always has it
        rewrite = None
    if rewrite is not None and hasattr(rewrite, "_rewrite_test"):
        rewrite_test, read_pyc, write_pyc = rewrite._rewrite_test, rewrite._read_pyc, rewrite._write_pyc

        by_hash = "source_hash" in rewrite_test.__code__.co_varnames  # pytest >= 9: (source hash, code)

        def _rewrite_test(*args):
            fn = args[1] if hasattr(args[0], "getini") else args[0]  # pytest < 5: (config, fn)
            code = ask(("serve", str(fn), "rewrite")) if os.path.basename(str(fn)) in names else None
            if code is None:
                return rewrite_test(*args)
            if by_hash:  # what pytest keys a .pyc by; no .pyc is written for this code anyway
                import importlib.util

                with open(str(fn), "rb") as fh:
                    return importlib.util.source_hash(fh.read()), code
            return (fn.stat() if hasattr(fn, "strpath") else os.stat(str(fn))), code

        def _read_pyc(source, *args, **kwargs):
            if os.path.basename(str(source)) in names and ask(("test_code", str(source))):
                return None  # always compile: the fixed code, never a cached one
            return read_pyc(source, *args, **kwargs)

        def _write_pyc(state, co, *args, **kwargs):
            if ask(("ours", co)):
                return True
            return write_pyc(state, co, *args, **kwargs)

        rewrite._rewrite_test, rewrite._read_pyc, rewrite._write_pyc = _rewrite_test, _read_pyc, _write_pyc
    from importlib.machinery import SourceFileLoader  # only when the probe patches loaders

    get_code = SourceFileLoader.get_code

    def _get_code(self, fullname):
        path = getattr(self, "path", None)
        if path and os.path.basename(path) in names:
            code = ask(("serve", path, "plain"))
            if code is not None:
                return code
        return get_code(self, fullname)

    SourceFileLoader.get_code = _get_code


def expected(ask, item):
    """(status, code objects) of ``item``'s own test function, from the fixed code: status
    "fixed", "unknown" (the file is fixed, its function not found by name: generated,
    inherited from another file), "missing" (the file was not run from the fixed code) or
    None (not a file the grader named)."""
    path = str(getattr(item, "path", None) or getattr(item, "fspath", ""))
    parts = [p for p in str(item.nodeid).split("::")[1:] if p != "()"]
    if not parts:
        return None, ()
    parts[-1] = str(getattr(item, "originalname", None) or parts[-1].split("[", 1)[0])
    return ask(("expect", path, parts))


def completed(frame, _returns=_RETURNS, _unsure=_UNSURE):
    """Did this (finished) frame of a plain function end by returning? None: cannot tell
    (a generator or coroutine, or Python < 3.8 inside try/with blocks)."""
    code = frame.f_code
    if code.co_flags & _CO_LAZY:
        return None
    at, raw = frame.f_lasti, code.co_code
    if not 0 <= at < len(raw):
        return None
    if raw[at] in _returns:
        return True
    return None if raw[at] in _unsure else False
