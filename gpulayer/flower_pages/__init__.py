"""gpulayer's pages in Flower: the fleet beside Flower's workers, and the distributed jobs.

Flower knows workers by their Celery events and tasks by name; the fleet it runs on is gpulayer's
(zones, regions, GPUs, slots, gangs). What ``gpulayer status`` prints (``status.collect``) is served
to Flower's pages three ways:

- ``/gangs``: a page listing every distributed job not yet finished: its state, placement and the
  reason for it, its ranks and the workers they run on; a waiting one with its place in line and why.
- ``/gpulayer/fleet.json``: the same report as JSON, for the script below.
- ``/gpulayer/output/<job id>.json``: what a job printed, as kept (``gpulayer/output/tail.py``), which
  ``fleet.js`` shows on the job's task page under "Output (gpulayer)".
- ``fleet.js``, added to every page of Flower's: a Gangs tab in the navigation bar, a fleet table
  (zone, region, CUDA and GPUs, slots free, running and held by gangs) on the Workers page, and the
  same for one worker, with the gangs holding its slots, on that worker's page.

Every page answers to Flower's own login; the engine fence (``engine/flower.py``) adds them.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent
GANGS_TEMPLATE = HERE / "templates" / "gangs.html"
STATIC = HERE / "static"
SCRIPT = "gpulayer/static/fleet.js"


def fleet_report() -> dict:
    """``gpulayer status --json``'s report, every worker listed."""
    from ..status import collect

    return collect(full=True)


def job_output(job_id: str) -> dict:
    """A job's kept lines: ``{"job": id, "lines": [{"stream": "out" | "err", "text": ...}, ...]}``."""
    from ..app import redis_client
    from ..output import tail

    client = redis_client()
    try:
        return {"job": job_id, "lines": [{"stream": s, "text": t} for _, s, t in tail.entries(client, job_id)]}
    finally:
        client.close()


def pages():
    from ..engine.flower import Pages

    return Pages(fleet_report, GANGS_TEMPLATE, STATIC, job_output)


def script_transform(url_prefix: str, static_prefix: str):
    """A Tornado output transform that adds ``fleet.js`` to each HTML page (Flower's and ours).

    Flower writes a page in one piece; a page that comes in several chunks, or carries no ``</body>``,
    passes untouched.
    """
    from tornado.web import OutputTransform

    root = "/" + url_prefix.strip("/") if url_prefix.strip("/") else ""
    tag = f'<script src="{root}/{SCRIPT}"></script></body>'.encode()

    class AddFleetScript(OutputTransform):
        def __init__(self, request):
            super().__init__(request)
            self._skip = request.path.startswith((static_prefix, f"{root}/api/", f"{root}/gpulayer/"))

        def transform_first_chunk(self, status_code, headers, chunk, finishing):
            ctype = headers.get("Content-Type", "").split(";")[0].strip().lower()
            if self._skip or not finishing or ctype != "text/html" or b"</body>" not in chunk:
                return status_code, headers, chunk
            head, _, tail = chunk.rpartition(b"</body>")
            chunk = head + tag + tail
            if "Content-Length" in headers:
                headers["Content-Length"] = str(len(chunk))
            return status_code, headers, chunk

    return AddFleetScript
