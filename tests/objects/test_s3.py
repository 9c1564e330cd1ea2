"""The S3 backend against a real S3-compatible server process (moto's server mode on loopback): objects appear
whole or not at all, a large one travels in parts without a second copy in memory, the sweep's listing sees only
our keys, and every way of misconfiguring it says what to fix."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap

import pytest

from gpulayer.errors import ConfigError
from gpulayer.objects import s3 as s3mod
from gpulayer.objects.s3 import CONCURRENCY, PART, S3, ObjectStoreUnavailable
from gpulayer.lab.s3_server import closed_port_url
from tests.objects.servers import BUCKET, s3_env, s3_server, s3_url  # noqa: F401 (fixtures)

OID = "0123456789abcdef" * 2


def oid(i: int) -> str:
    return f"{i:032x}"


def digest_of_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def test_a_large_object_round_trips_in_parts(s3_env, tmp_path):
    data = os.urandom(1 << 20) * 210  # 220 MB: 14 parts each way
    backend = S3(s3_url())
    with backend.writer(OID) as f:
        assert f.write(data) == len(data)  # one call: the writer hands obstore a part at a time
    assert backend.size(OID) == len(data) > 10 * PART
    assert backend.download(OID, tmp_path / "copy") == len(data)
    assert digest_of_file(tmp_path / "copy") == hashlib.sha256(data).hexdigest()


def test_an_upload_holds_no_second_copy_of_the_value(s3_env):
    # In a process of its own, so its resident memory is only this: a 256 MiB buffer written in one call.
    script = textwrap.dedent("""
        import sys, threading, psutil
        from gpulayer.objects.s3 import S3
        size = 256 * 2**20
        data = bytearray(b"x") * size
        me = psutil.Process()
        before = peak = me.memory_info().rss
        done = threading.Event()
        def sample():
            global peak
            while not done.wait(0.005):
                peak = max(peak, me.memory_info().rss)
        t = threading.Thread(target=sample); t.start()
        with S3(sys.argv[1]).writer("%s") as f:
            f.write(data)
        done.set(); t.join()
        print(peak - before)
    """ % OID)
    out = subprocess.run([sys.executable, "-c", script, s3_url()], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    grown = int(out.stdout.split()[-1])
    # obstore buffers a part and keeps up to CONCURRENCY in flight: far less than the value itself
    assert grown < PART * (CONCURRENCY + 2) < 256 * 2**20, \
        f"the upload of 256 MiB grew the process by {grown / 2**20:.0f} MiB"


def test_a_failed_upload_leaves_nothing(s3_env):
    backend = S3(s3_url())
    with pytest.raises(KeyError):
        with backend.writer(OID) as f:
            f.write(b"x" * (2 * PART + 1))  # parts already sent: the multipart upload is aborted
            raise KeyError("the value's pickling failed")
    assert not backend.exists(OID)
    assert list(backend.list_old(-60)) == []


def test_put_file_uploads_a_file(s3_env, tmp_path):
    path = tmp_path / "written-elsewhere"
    path.write_bytes(os.urandom(PART + 12345))
    backend = S3(s3_url())
    backend.put_file(OID, path)
    backend.download(OID, tmp_path / "back")
    assert (tmp_path / "back").read_bytes() == path.read_bytes()


def test_the_sweeps_listing_names_only_our_objects_and_delete_is_idempotent(s3_env):
    import obstore
    from obstore.store import S3Store

    prefix = os.urandom(6).hex()
    backend = S3(s3_url(prefix))
    for i in range(3):
        with backend.writer(oid(i)) as f:
            f.write(b"%d" % i)
    raw = S3Store(BUCKET, prefix=prefix, client_options={"allow_http": True})
    obstore.put(raw, "notes.txt", b"someone else's")
    obstore.put(raw, f"sub/{oid(9)}", b"below a further /")

    assert sorted(name for name, _ in backend.list_old(-60)) == [oid(0), oid(1), oid(2)]
    assert list(backend.list_old(3600)) == []  # all just written
    backend.delete(oid(1))
    backend.delete(oid(1))  # already gone: fine
    assert sorted(name for name, _ in backend.list_old(-60)) == [oid(0), oid(2)]
    assert obstore.head(raw, "notes.txt")["size"] == len(b"someone else's")


def test_a_missing_object_is_file_not_found_naming_it(s3_env, tmp_path):
    backend = S3(s3_url())
    with pytest.raises(FileNotFoundError, match=f"cannot read {OID} in object store s3://{BUCKET}/.*not there"):
        backend.download(OID, tmp_path / "x")


def test_a_missing_bucket_names_it(s3_env):
    with pytest.raises(ConfigError, match="bucket 'no-such-bucket' does not exist; create it"):
        S3("s3://no-such-bucket/objects")


def test_missing_credentials_say_which_variables_to_set(s3_env, monkeypatch):
    # (s3_env points the instance metadata endpoint at a closed loopback port: nothing leaves the machine)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(ConfigError, match="no credentials.*set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        S3(s3_url())


def test_an_endpoint_that_does_not_answer_names_it(s3_env, monkeypatch):
    endpoint = closed_port_url()
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    with pytest.raises(ObjectStoreUnavailable, match=f"{endpoint} does not answer; check AWS_ENDPOINT_URL"):
        S3(s3_url())


def test_without_obstore_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "obstore", None)  # import obstore raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'gpulayer\[s3\]'"):
        S3("s3://bucket/prefix")


@pytest.mark.parametrize("url", ["s3://", "s3:///prefix", "s3://bucket/prefix?x=1"])
def test_a_malformed_url_says_what_one_looks_like(url):
    with pytest.raises(ConfigError, match="give s3://bucket or s3://bucket/prefix"):
        s3mod.parse_url(url)


# -- fork: obstore's runtime does not survive one (objects/s3_helper.py) ------------------------------------------

FORKING = textwrap.dedent("""
    import os, sys
    from gpulayer.objects import s3_helper
    from gpulayer.objects.s3 import S3
    s3_helper.forking_process()  # as a worker's main process does
    url, oid = sys.argv[1], sys.argv[2]
    parent = S3(url)
    assert not parent.exists(oid) and list(parent.list_old(-60)) == []
    assert "obstore" not in sys.modules  # never started here: the helper made the requests
    pid = os.fork()
    if pid == 0:  # a pool process: its own obstore, through the instance it inherited
        with parent.writer(oid) as f:
            f.write(b"from the child")
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert status == 0, status
    assert parent.exists(oid) and [name for name, _ in parent.list_old(-60)] == [oid]
    parent.delete(oid)
    assert not parent.exists(oid)
    try:
        with parent.writer(oid) as f:
            pass
    except RuntimeError as err:
        print("refused:", err)
""")

FORKED_AFTER_USE = textwrap.dedent("""
    import os, sys
    from gpulayer.objects.s3 import S3
    S3(sys.argv[1])  # obstore's runtime starts here
    pid = os.fork()
    if pid == 0:
        try:
            S3(sys.argv[1])
        except Exception as err:
            print(type(err).__name__, err, flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
""")


def test_a_forking_process_sends_its_requests_to_the_helper_and_its_children_use_s3(s3_env):
    out = subprocess.run([sys.executable, "-c", FORKING, s3_url(), OID], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "refused: a worker's main process moves no object bytes" in out.stdout


def test_a_child_forked_after_its_parent_used_s3_is_told_why_instead_of_hanging(s3_env):
    out = subprocess.run([sys.executable, "-c", FORKED_AFTER_USE, s3_url()], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ObjectStoreUnavailable this process")
    assert "'spawn' or 'forkserver'" in out.stdout
