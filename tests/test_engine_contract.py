"""The engine contract: every upstream method gpulayer overrides, copies or patches is pinned to its source.

``gpulayer/engine/upstream.py`` records, per method, a hash of the source it was written against
(Celery 5.7, kombu 5.7, Flower 2.2, redis-py 8.1). These tests hash the installed packages and
fail, naming the method and what to do, when upstream changed one; check that every override in
``gpulayer/engine/`` is listed; check that nothing outside ``engine/`` overrides or patches
upstream internals; and show each check failing against a modified upstream. The few private names of pydantic
and CPython used outside Celery's stack (``store/packed.py``, ``procs/runner.py``) are pinned there too, and checked
here by what they do as well as by hash.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pkgutil
import platform
import textwrap
import tomllib
import types
from pathlib import Path

import pytest
from celery.app import trace as celery_trace
from kombu.transport import redis as kredis
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import gpulayer
import gpulayer.engine
from gpulayer.engine import upstream
from gpulayer.engine.upstream import BORROWED, WRITTEN_FOR, Borrowed, changes, digest, patch, unlisted

PACKAGE = Path(gpulayer.__file__).parent
ROOT = PACKAGE.parent

# Modules outside engine/ that override upstream methods on purpose, each with the reason (listed in BORROWED all the
# same). None: redis-py's TLS connection moved to engine/redis_tls.py.
OUTSIDE_ENGINE: dict[str, str] = {}
ALLOWED_OUTSIDE: dict[tuple[str, str], str] = {}
UPSTREAM = ("celery", "kombu", "flower", "billiard", "redis", "tornado")


def engine_modules() -> list[types.ModuleType]:
    return [importlib.import_module(f"gpulayer.engine.{m.name}") for m in pkgutil.iter_modules(gpulayer.engine.__path__)]


def assert_as_written(found) -> None:
    assert not found, "upstream changed under gpulayer/engine:\n" + "\n".join(str(c) for c in found)


# -- the hashes ------------------------------------------------------------------------------------
def test_every_borrowed_method_is_as_written():
    assert len(BORROWED) >= 30 and len({b.target for b in BORROWED}) == len(BORROWED)
    assert all(b.how in upstream.HOW and b.package in WRITTEN_FOR and all((ROOT / f).is_file() for f in b.files)
               for b in BORROWED)
    assert all(f.startswith("gpulayer/engine/") for b in BORROWED for f in b.also)
    assert_as_written(changes())


def _modified_copy(func, tmp_path: Path, old: str, new: str):
    """``func`` rebuilt from its own source with one line changed, in a module file (so it has source)."""
    source = textwrap.dedent(inspect.getsource(func))
    assert source.count(old) == 1, old
    path = tmp_path / "modified_upstream.py"
    path.write_text(source.replace(old, new))
    spec = importlib.util.spec_from_file_location("modified_upstream", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, func.__name__)


def test_the_contract_fails_against_a_modified_copy_of_one_upstream_method(tmp_path, monkeypatch):
    """kombu's ``Channel._brpop_read`` with one line changed: the check names it, the version and the fix."""
    modified = _modified_copy(kredis.Channel._brpop_read, tmp_path, "self._in_poll = None", "self._in_poll = False")
    monkeypatch.setattr(kredis.Channel, "_brpop_read", modified)
    found = changes()
    assert [c.entry.target for c in found] == ["kombu.transport.redis:Channel._brpop_read"]
    message = str(found[0])
    assert message.startswith("kombu.transport.redis.Channel._brpop_read changed upstream since kombu 5.7.0 "
                              "(installed: kombu "), message
    assert "re-read our override in gpulayer/engine/transport.py" in message and "update the kombu pin" in message
    assert "\n" not in message
    with pytest.raises(AssertionError, match=r"kombu\.transport\.redis\.Channel\._brpop_read changed upstream"):
        assert_as_written(found)


def test_the_contract_fails_when_an_upstream_method_is_gone(monkeypatch):
    monkeypatch.delattr(kredis.Channel, "_brpop_start")
    found = changes()
    assert [c.entry.target for c in found] == ["kombu.transport.redis:Channel._brpop_start"]
    assert found[0].found is None and "no longer exists in kombu" in str(found[0])
    assert "rewrite our override in gpulayer/engine/transport.py" in str(found[0])


def test_a_changed_line_counts_and_comments_or_indentation_do_not():
    source = "    def f(self):\n        x = 1\n        return x\n"
    assert digest(source) == digest("def f(self):\n\n    # why x is 1\n    x = 1   \n    return x")
    assert digest(source) != digest(source.replace("x = 1", "x = 2"))
    entry = Borrowed("kombu.transport.redis:Channel._size", digest(source), "gpulayer/engine/transport.py", "overrides")
    assert changes([entry], source=lambda target: source) == []
    [change] = changes([entry], source=lambda target: source.replace("return x", "return -x"))
    assert "kombu.transport.redis.Channel._size changed upstream since kombu 5.7.0" in str(change)


# -- every override listed -------------------------------------------------------------------------
def test_every_override_in_engine_is_listed():
    modules = engine_modules() + [importlib.import_module(m) for m in OUTSIDE_ENGINE]
    assert {m.__name__.rsplit(".", 1)[1] for m in modules} >= {"transport", "results", "request", "events"}
    missing = unlisted(modules)
    assert not missing, ("gpulayer/engine overrides upstream methods that gpulayer/engine/upstream.py BORROWED does "
                         f"not list: {sorted(missing)}; add each with its source hash "
                         "(`python -m gpulayer.engine.upstream` prints them)")


def test_an_unlisted_override_is_found():
    module = types.ModuleType("gpulayer.engine.fake")
    exec("from kombu.transport import redis\nclass Channel(redis.Channel):\n"
         "    def _size(self, queue):\n        return 0\n    def _ours(self):\n        return 1\n", module.__dict__)
    assert unlisted([module]) == {"kombu.transport.redis:Channel._size"}
    # A method a mixin of ours gives the class counts as the class's own (engine/prefetch.py's Prefetch).
    mixed = types.ModuleType("gpulayer.engine.fake_mixed")
    exec("from kombu.transport import redis\nclass Mixin:\n    def _size(self, queue):\n        return 0\n"
         "    def _ours(self):\n        return 1\nclass Channel(Mixin, redis.Channel):\n    pass\n", mixed.__dict__)
    assert unlisted([mixed]) == {"kombu.transport.redis:Channel._size"}


def test_patch_refuses_an_unlisted_target_and_keeps_the_original_for_the_contract(monkeypatch):
    with pytest.raises(LookupError, match="not listed as patched"):
        patch(kredis.Channel, "kombu.transport.redis:Channel._size", lambda self, queue: 0)
    with pytest.raises(LookupError, match="not listed as patched"):  # listed, but as overridden
        patch(kredis.Channel, "kombu.transport.redis:Channel._put", lambda *a, **k: None)
    monkeypatch.setattr(celery_trace, "LOG_RECEIVED", celery_trace.LOG_RECEIVED)  # restored afterwards
    monkeypatch.setattr(upstream, "_originals", {})
    patch(celery_trace, "celery.app.trace:LOG_RECEIVED", "Job %(id)s received")
    assert celery_trace.LOG_RECEIVED == "Job %(id)s received"
    assert_as_written(changes())  # the contract still reads Celery's own value, not ours


# -- the pins --------------------------------------------------------------------------------------
def test_pyproject_pins_each_package_to_the_minor_version_engine_was_written_for():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = {r.name: r for r in map(Requirement, project["dependencies"])}
    assert SpecifierSet(project["requires-python"]).contains(WRITTEN_FOR["python"])
    for package, written in WRITTEN_FOR.items():
        if package == "python":  # the standard library's entries: the hashes name what differs on another version
            continue
        v = Version(written)
        spec = reqs[package].specifier
        assert spec.contains(written), f"{package}: pyproject pins {spec}, engine was written for {written}"
        assert not spec.contains(f"{v.major}.{v.minor + 1}.0"), f"{package} {spec} lets the next minor version in"
        if v.minor:
            assert not spec.contains(f"{v.major}.{v.minor - 1}.999"), f"{package} {spec} lets an older minor in"


# -- the fence: nothing outside engine/ overrides or patches upstream internals ----------------------
def _upstream_names(tree: ast.Module) -> dict[str, str]:
    """Names a module binds to upstream modules or objects -> the dotted name they stand for."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in UPSTREAM:
                    names[(a.asname or a.name).split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in UPSTREAM:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _dotted(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def _upstream_object(dotted: str):
    """Import ``a.b.C`` as far as it is a module, then take the rest as attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def fence_violations(path: Path, rel: str) -> list[str]:
    """What ``path`` does that only engine/ may: override a private upstream method, patch upstream, set
    another object's private attribute in a module that uses upstream, or bind a method onto an object."""
    tree = ast.parse(path.read_text())
    names = _upstream_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                dotted = _dotted(base)
                if not dotted or dotted[0] not in names:
                    continue
                upstream_cls = _upstream_object(".".join([names[dotted[0]], *dotted[1:]]))
                for item in node.body:
                    if (isinstance(item, ast.FunctionDef) and item.name.startswith("_")
                            and not item.name.startswith("__") and hasattr(upstream_cls, item.name)
                            and (rel, f"{node.name}.{item.name}") not in ALLOWED_OUTSIDE):
                        found.append(f"{rel}:{item.lineno}: {node.name}.{item.name} overrides "
                                     f"{upstream_cls.__module__}.{upstream_cls.__name__}.{item.name}")
                own = {item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
                for sub in ast.walk(node):  # self._x that only the upstream base defines: its private method or state
                    if (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self"
                            and sub.attr.startswith("_") and not sub.attr.startswith("__") and sub.attr not in own
                            and hasattr(upstream_cls, sub.attr)):
                        found.append(f"{rel}:{sub.lineno}: {node.name} uses self.{sub.attr} of "
                                     f"{upstream_cls.__module__}.{upstream_cls.__name__}")
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            dotted = _dotted(target) if isinstance(target, ast.Attribute) else None
            if not dotted:
                continue
            if dotted[0] in names:
                found.append(f"{rel}:{node.lineno}: assigns {'.'.join(dotted)} (an upstream attribute)")
            elif names and dotted[-1].startswith("_") and dotted[:-1] not in (["self"], ["cls"]):
                # in a module that uses upstream (Celery's app, a consumer): gpulayer's own objects do this
                found.append(f"{rel}:{node.lineno}: assigns {'.'.join(dotted)} (another object's private attribute)")
        if isinstance(node, ast.Call):
            called = _dotted(node.func) or []
            if called[-1:] == ["MethodType"] and (rel, "MethodType") not in ALLOWED_OUTSIDE:
                found.append(f"{rel}:{node.lineno}: binds a method onto an object (MethodType)")
            if called == ["setattr"] and node.args and (_dotted(node.args[0]) or [""])[0] in names:
                found.append(f"{rel}:{node.lineno}: setattr on an upstream object")
    return found


ALLOWED_OUTSIDE[("gpulayer/trainer/cli.py", "MethodType")] = (
    "binds LightningCLI's configure_optimizers onto the user's module (torch), as Lightning's CLI does; no Celery")


def test_nothing_outside_engine_overrides_or_patches_upstream_internals():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith("gpulayer/engine/"):
            found += fence_violations(path, rel)
    assert not found, ("outside gpulayer/engine/ (move each into an engine/ module, list it in engine/upstream.py "
                       "BORROWED, and patch through engine.upstream.patch): " + "; ".join(found))


def test_the_fence_finds_each_kind_of_breach(tmp_path):
    path = tmp_path / "breach.py"
    path.write_text(textwrap.dedent("""\
        from types import MethodType
        from celery.app import trace as celery_trace
        from flower.app import Flower
        from kombu.transport import redis as kredis

        class Channel(kredis.Channel):
            def _put(self, queue, message, **kwargs): ...
            def _ours(self): ...
            def append(self): ...
            def size(self): return self._size("q")

        def install(app, qos):
            celery_trace.LOG_RECEIVED = "x"
            Flower.__init__ = None
            app._pool = None
            qos.can_consume = MethodType(lambda self: True, qos)
            setattr(kredis.Channel, "_size", None)
        """))
    found = fence_violations(path, "gpulayer/breach.py")
    assert [f.split(": ", 1)[1] for f in found] == [
        "Channel._put overrides kombu.transport.redis.Channel._put",
        "Channel uses self._size of kombu.transport.redis.Channel",
        "assigns celery_trace.LOG_RECEIVED (an upstream attribute)",
        "assigns Flower.__init__ (an upstream attribute)",
        "assigns app._pool (another object's private attribute)",
        "binds a method onto an object (MethodType)",
        "setattr on an upstream object",
    ], found


# -- the fence, for reads: nothing outside engine/ reaches into upstream internals ----------------------------
# Upstream modules whose insides are engine/'s: the worker's state, requests and consumer steps, Celery's trace and
# backends, kombu's transports and event loop, redis-py's connections, Flower.
INTERNAL_MODULES = ("celery.worker.state", "celery.worker.request", "celery.worker.consumer", "celery.worker.strategy",
                    "celery.worker.control", "celery.worker.loops", "celery.app.trace", "celery.backends",
                    "celery.concurrency", "kombu.transport", "kombu.asynchronous", "redis.connection", "flower")
# Attributes of upstream objects that are private structure, though not spelled with "_": kombu's unacked records,
# its channels' QoS and restore, Celery's task consumer and worker state; and the private ones gpulayer once read.
PRIVATE_STRUCTURE = {"qos", "unacked_key", "unacked_index_key", "unacked_mutex_key", "restore_by_tag",
                     "restore_unacked", "task_consumer", "active_requests", "reserved_requests", "scheduled_requests",
                     "_wrap_socket_with_ssl", "_request_dict", "_message"}
# Keys of kombu's message envelope that only its layout has (engine/envelope.py reads it): a string of these outside
# engine/ is code parsing a kombu message itself.
ENVELOPE_KEYS = {"body_encoding", "delivery_tag", "delivery_info", "content-encoding"}
# Lab modules (gpulayer/lab/: fleet.py, netns.py, emulator/) allowed a breach, each with the reason. None: they use engine/.
LAB_EXEMPT: dict[str, str] = {}


def _internal(dotted: str) -> bool:
    return any(dotted == m or dotted.startswith(m + ".") for m in INTERNAL_MODULES)


def reach_violations(path: Path, rel: str) -> list[str]:
    """Where ``path`` reaches into upstream internals, which only engine/ may do (each case has an engine/ function
    to call instead). The rule, on the source's ``ast``:

    1. no import of an internal upstream module (``INTERNAL_MODULES``: ``celery.worker.state``,
       ``kombu.transport.redis``...), nor of a class, function or module from one (a constant, such as kombu's
       ``PRIORITY_STEPS``, is a value, not structure); no private name (``_x``) imported from any upstream package;
    2. no attribute named in ``PRIVATE_STRUCTURE`` (``.qos``, ``.unacked_key``, ``.restore_by_tag``,
       ``.active_requests``, ``._wrap_socket_with_ssl``...), on any object: those names are upstream's structure;
    3. no private attribute (``_x``, not ``__x__``) anywhere along a name bound to an upstream module or object
       (``kredis.Channel._brpop_read``, ``celery_trace._fast_trace``);
    4. no string naming a key of kombu's message envelope (``ENVELOPE_KEYS``: ``"delivery_tag"``,
       ``"body_encoding"``...): a message is parsed by engine/envelope.py.
    """
    tree = ast.parse(path.read_text())
    names = _upstream_names(tree)
    found = []
    for node in ast.walk(tree):
        imported: list[tuple[str, str]] = []  # (dotted module or object, as written)
        if isinstance(node, ast.Import):
            imported = [(a.name, a.name) for a in node.names if a.name.split(".")[0] in UPSTREAM]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in UPSTREAM:
            imported = [(f"{node.module}.{a.name}", f"from {node.module} import {a.name}") for a in node.names]
        for dotted, written in imported:
            if any(part.startswith("_") and not part.startswith("__") for part in dotted.split(".")):
                found.append(f"{rel}:{node.lineno}: {written} (a private upstream name)")
            elif _internal(dotted):
                obj = _upstream_object(dotted)
                if inspect.isclass(obj) or inspect.ismodule(obj) or callable(obj):
                    found.append(f"{rel}:{node.lineno}: {written} (an upstream internal)")
        if isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if node.attr in PRIVATE_STRUCTURE:
                found.append(f"{rel}:{node.lineno}: .{node.attr} (upstream's private structure)")
            elif dotted and dotted[0] in names and node.attr.startswith("_") and not node.attr.startswith("__"):
                found.append(f"{rel}:{node.lineno}: {'.'.join(dotted)} (a private upstream attribute)")
        if isinstance(node, ast.Constant) and node.value in ENVELOPE_KEYS:
            found.append(f"{rel}:{node.lineno}: {node.value!r} (kombu's message envelope)")
    return found


def test_nothing_outside_engine_reaches_into_upstream_internals():
    """The fence is complete: every access to a private part of Celery, kombu, Flower or redis-py (an override, a
    copy, a patch, or a read of its structure) is in gpulayer/engine/, each listed in engine/upstream.py."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith("gpulayer/engine/") and rel not in LAB_EXEMPT:
            found += reach_violations(path, rel)
    assert not found, ("outside gpulayer/engine/ (call an engine/ function instead: engine/qos.py for the worker's "
                       "requests and slot gate, engine/delivery.py for unacked deliveries, engine/envelope.py for a "
                       "message's layout; or add one there, listed in engine/upstream.py): " + "; ".join(found))


def test_the_reach_fence_finds_each_kind_of_breach(tmp_path):
    path = tmp_path / "breach.py"
    path.write_text(textwrap.dedent("""\
        import redis
        from celery.worker import state as worker_state
        from kombu.transport.redis import Channel, PRIORITY_STEPS
        from kombu.transport import redis as kredis
        from celery.app.trace import _fast_trace_task

        def peek(c, channel, req):
            qos = c.task_consumer.channel.qos
            channel.qos.restore_by_tag("t")
            n = len(worker_state.active_requests)
            key = kredis.Channel._brpop_read
            conn = redis.connection.SSLConnection._wrap_socket_with_ssl
            tag = req.message["properties"]["delivery_tag"]
            return req._request_dict, PRIORITY_STEPS, redis.Redis.from_url
        """))
    found = [f.split(": ", 1)[1] for f in reach_violations(path, "gpulayer/breach.py")]
    expected = [
        "from celery.worker import state (an upstream internal)",
        "from kombu.transport.redis import Channel (an upstream internal)",
        "from kombu.transport import redis (an upstream internal)",
        "from celery.app.trace import _fast_trace_task (a private upstream name)",
        ".qos (upstream's private structure)",
        ".task_consumer (upstream's private structure)",
        ".restore_by_tag (upstream's private structure)",
        ".qos (upstream's private structure)",
        ".active_requests (upstream's private structure)",
        "kredis.Channel._brpop_read (a private upstream attribute)",
        "._wrap_socket_with_ssl (upstream's private structure)",
        "._request_dict (upstream's private structure)",
        "'delivery_tag' (kombu's message envelope)",
    ]
    assert sorted(found) == sorted(expected), found
    assert not any("PRIORITY_STEPS" in f or "from_url" in f for f in found)  # a constant, a public method


@pytest.mark.parametrize("tz", ["UTC", "Europe/Paris", "America/New_York"])
def test_the_apps_clock_tells_the_time_celerys_does(tz):
    """gpulayer's app stamps results with a cheaper ``now()``: the same instant and the same zone as Celery's."""
    from celery import Celery

    from gpulayer.engine.celery_app import GpulayerCelery

    ours, theirs = GpulayerCelery(set_as_current=False), Celery(set_as_current=False)
    for app in (ours, theirs):
        app.conf.timezone = tz
    a, b = ours.now(), Celery.now(theirs)
    assert a.tzinfo is not None and a.utcoffset() == b.utcoffset() and str(a.tzinfo) == str(b.tzinfo)
    assert abs((a - b).total_seconds()) < 1


# -- pydantic's and CPython's private names, outside Celery's stack ---------------------------------------------
def _private_uses(path: Path) -> set[str]:
    """The names of ``upstream.PRIVATE_OUTSIDE`` that ``path`` uses, as an attribute or a string."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        name = node.attr if isinstance(node, ast.Attribute) else node.value if isinstance(node, ast.Constant) else None
        if isinstance(name, str) and name in upstream.PRIVATE_OUTSIDE:
            found.add(name)
    return found


def test_private_names_of_pydantic_and_cpython_are_used_only_where_pinned():
    ours = {b.ours for b in BORROWED if b.package in ("pydantic", "python")}
    assert set(upstream.PRIVATE_OUTSIDE.values()) <= ours
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("gpulayer/engine/"):
            continue
        found += [f"{rel}: {name}" for name in sorted(_private_uses(path)) if upstream.PRIVATE_OUTSIDE[name] != rel]
    assert not found, ("private names of pydantic or CPython outside the files pinned for them in "
                       "gpulayer/engine/upstream.py (use the public API, or add an entry there): " + "; ".join(found))
    assert _private_uses(ROOT / "gpulayer/store/packed.py") == {"__pydantic_fields_set__", "__pydantic_extra__",
                                                               "__pydantic_private__"}


def test_a_trusted_record_is_what_model_construct_makes_slot_by_slot():
    """``store/packed.py`` sets a model's slots itself: the same state as pydantic's own unvalidated constructor, in
    every slot pydantic has (a slot pydantic adds is unset in ours and fails here)."""
    from gpulayer.models import WorkerInfo
    from gpulayer.store import packed

    fields = {"id": "w1", "hostname": "h", "address": "10.0.0.1", "zone": "z", "region": "r", "gpus": 2,
              "gpu_names": ("A100", "A100"), "slots": 2, "busy": 1, "held": 0, "pid": 7, "started_at": 1.0,
              "heartbeat_age": 0.5}
    for fields_set in (None, {"id", "busy"}):
        ours = packed.trusted(dict(fields), fields_set)
        theirs = WorkerInfo.model_construct(_fields_set=set(WorkerInfo.model_fields) if fields_set is None
                                            else fields_set, **fields)
        [many] = packed._models([dict(fields)])
        slots = [s for k in type(ours).__mro__ for s in getattr(k, "__slots__", ())]
        assert set(packed._SLOTS) <= set(slots)
        for slot in slots:
            assert getattr(ours, slot) == getattr(theirs, slot), slot
            if fields_set is None:
                assert getattr(many, slot) == getattr(theirs, slot), slot
        assert ours == theirs and ours.model_fields_set == theirs.model_fields_set
        copy = ours.model_copy(update={"busy": 2})  # a copy does not add to the shared set of a read
        assert copy.busy == 2 and ours.model_fields_set == theirs.model_fields_set


def test_a_ranks_fast_exit_finds_torchs_library_finalizers():
    """``procs/runner.py`` switches off torch.library's exit finalizers through CPython's table of live finalizers:
    the table is still there, torch's are in it, and only they are switched off."""
    import atexit
    import weakref

    import torch.library  # noqa: F401

    from gpulayer.procs.runner import _skip_torch_library_finalizers

    assert callable(atexit._run_exitfuncs) and isinstance(weakref.finalize._registry, dict)
    lib = torch.library.Library("gpulayer_contract_test", "DEF")  # one finalizer of torch.library's, at least
    mine = weakref.finalize(lib, lambda: None)
    torchs = [f for f, info in weakref.finalize._registry.items()
              if getattr(info.func, "__module__", None) == "torch.library"]
    assert torchs and all(f.atexit for f in torchs)
    try:
        _skip_torch_library_finalizers()
        assert not any(f.atexit for f in torchs) and mine.atexit
    finally:
        for f in torchs:
            f.atexit = True
        mine.detach()
        del lib


def test_the_contract_names_the_fix_for_pydantic_and_python_entries():
    by_package = {b.package: b for b in BORROWED if b.package in ("pydantic", "python")}
    [pyd] = changes([by_package["pydantic"]], source=lambda target: "changed")
    assert "changed upstream since pydantic 2.14.4" in str(pyd) and "the pydantic pin in pyproject.toml" in str(pyd)
    [std] = changes([by_package["python"]], source=lambda target: "changed")
    assert f"changed upstream since python {WRITTEN_FOR['python']}" in str(std)
    assert "the python version in WRITTEN_FOR" in str(std) and std.installed == platform.python_version()
