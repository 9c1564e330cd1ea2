"""Flower's application, extended: our output transforms ahead of its own, our pages beside its own, and
bad input to its API answered with a 4xx and the reason.

Flower builds its Tornado application itself (``flower.app.Flower``, from ``celery flower``'s command) and
offers no hook to add a transform or a handler; so its ``__init__`` is wrapped, in this process only, to
insert the transforms first (before gzip) and to add the handlers through Tornado's own
``Application.add_handlers``, which matches them ahead of Flower's. The pages subclass Flower's
``BaseHandler``, so they answer to the same login (``--basic-auth``) as Flower's own. Pinned to Flower 2.2
in engine/upstream.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..errors import ClusterUnavailable, GpulayerError, JobRejected
from .upstream import patch, resolve


def extend(make_transforms: Callable[[str, str], list[type]], pages: "Pages") -> None:
    """Every Flower application built in this process runs ``make_transforms(url_prefix, static_url_prefix)`` first and
    serves ``pages`` (a Gangs page, the fleet's data, their static files) ahead of its own."""
    from flower.app import Flower
    from flower.utils.blocking import BlockingOperationRunner

    original = Flower.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        url_prefix = self.options.url_prefix or ""
        self.transforms[0:0] = make_transforms(url_prefix, self.settings.get("static_url_prefix", "/static/"))
        self.add_handlers(r".*", pages.handlers(url_prefix))

    patch(Flower, "flower.app:Flower.__init__", __init__)
    patch(BlockingOperationRunner, "flower.utils.blocking:BlockingOperationRunner.run", _run)


# --- bad input to the API --------------------------------------------------------------------------

def input_status(exc: BaseException | None) -> int | None:
    """The HTTP status for an error of gpulayer's raised by an API call (``POST /api/task/async-apply/...``
    with a malformed function reference: 400), or None for anything else (Flower's own answer stands)."""
    if isinstance(exc, ClusterUnavailable):
        return 503
    if isinstance(exc, (JobRejected, ValueError)) and isinstance(exc, GpulayerError):
        return 400  # PayloadError, ConfigError, UnsupportedOption (ValueErrors), JobRejected
    return None


class _Refused:
    """What a blocking call returns instead of raising an error of the caller's input (see ``_run``)."""

    def __init__(self, status: int, error: BaseException):
        self.status, self.error = status, error


async def _run(self, operation, target, func, *args, connection_errors=(), **kwargs):
    """Flower's blocking runner, with gpulayer's input errors answered as a 4xx that says why.

    Flower turns any other exception of a call (``task.apply_async`` for ``/api/task/async-apply/...``)
    into a bare 500 and logs its traceback; an error of the caller's input is returned out of the call
    instead, and raised here as the ``HTTPError`` Flower's API handlers answer with its message.
    """
    from tornado.web import HTTPError

    def call(*a, **kw):
        try:
            return func(*a, **kw)
        except Exception as exc:
            status = input_status(exc)
            if status is None:
                raise
            return _Refused(status, exc)

    result = await resolve("flower.utils.blocking:BlockingOperationRunner.run")(
        self, operation, target, call, *args, connection_errors=connection_errors, **kwargs)
    if isinstance(result, _Refused):
        raise HTTPError(result.status, "%s: %s", type(result.error).__name__, result.error) from result.error
    return result


# --- our pages -------------------------------------------------------------------------------------

class Pages:
    """gpulayer's pages in Flower: ``/gangs`` (``gangs_template`` rendered with ``report()``),
    ``/gpulayer/fleet.json`` (``report()`` as JSON), ``/gpulayer/output/<job id>.json`` (``output(job id)``:
    the job's kept lines, for its task page) and ``/gpulayer/static/`` (``static``).

    ``report`` and ``output`` read the cluster (blocking): they run on Flower's executor, never on its event loop.
    """

    def __init__(self, report: Callable[[], dict], gangs_template: Path, static: Path,
                 output: Callable[[str], dict] | None = None):
        self.report = report
        self.gangs_template = gangs_template
        self.static = static
        self.output = output

    def handlers(self, url_prefix: str) -> list:
        from tornado.web import StaticFileHandler, authenticated
        from flower.views import BaseHandler

        pages = self
        root = "/" + url_prefix.strip("/") if url_prefix.strip("/") else ""

        class GangsView(BaseHandler):
            @authenticated
            async def get(self):
                report = await self.application.io_loop.run_in_executor(None, pages.report)
                # An absolute template name: Tornado's loader opens it as is, and the template's
                # `{% extends "base.html" %}` resolves in Flower's own template directory.
                self.render(str(pages.gangs_template), report=report)

        class FleetData(BaseHandler):
            @authenticated
            async def get(self):
                self.set_header("Cache-Control", "no-store")
                self.write(await self.application.io_loop.run_in_executor(None, pages.report))

        class OutputData(BaseHandler):
            @authenticated
            async def get(self, job_id):
                self.set_header("Cache-Control", "no-store")
                self.write(await self.application.io_loop.run_in_executor(None, pages.output, job_id))

        handlers = [(f"{root}/gangs", GangsView), (f"{root}/gpulayer/fleet.json", FleetData),
                    (f"{root}/gpulayer/static/(.*)", StaticFileHandler, {"path": str(self.static)})]
        if self.output is not None:
            handlers.append((f"{root}/gpulayer/output/([0-9A-Za-z._-]+)\\.json", OutputData))
        return handlers
