"""Checks what lake needs of an S3-compatible server, against the one scripts/s3-server.sh starts.

    $(scripts/s3-env.sh) scripts/s3_probe.py [--rounds N] [--endpoint URL]

Prints, with the HTTP status of each answer: conditional PutObject (If-None-Match: *, If-Match),
conditional CopyObject, multipart upload with a conditional complete (and the copy-if-not-exists
object_store builds on it), ranged GETs, ListObjectsV2 with prefix, delimiter and pages,
DeleteObjects; how many of 8 clients racing one conditional write win, per round; what clients
see when the server is killed (SIGKILL) mid-request; how long the server takes to start. With
--endpoint it probes that server instead and leaves out the starts and kills.
docs/decisions/0025-s3-test-server.md holds its results.
"""

import argparse
import concurrent.futures as cf
import json
import os
import signal
import subprocess
import threading
import time

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
WRONG_ETAG = '"00000000000000000000000000000000"'


def start_server():
    """Starts a server with scripts/s3-server.sh; returns its endpoint, pid and the seconds it took."""
    started = time.time()
    out = subprocess.run([os.path.join(SCRIPTS, "s3-server.sh")], capture_output=True, text=True, check=True,
                         env={**os.environ, "LAKE_S3_WATCH_PID": str(os.getpid())}).stdout
    env = dict(line.split("=", 1) for line in out.split())
    return env["AWS_ENDPOINT_URL"], int(env["LAKE_S3_PID"]), time.time() - started


def client(endpoint):
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="lake",
                        aws_secret_access_key="lake-secret",
                        config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}, max_pool_connections=32))


def status(call):
    """The HTTP status and error code of a call."""
    try:
        r = call()
        return r["ResponseMetadata"]["HTTPStatusCode"], ""
    except ClientError as e:
        return e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"].get("Code", "")


def conformance(s3, bucket):
    rows = []

    def row(what, call):
        code, err = status(call)
        rows.append((what, f"{code} {err}".strip()))

    s3.create_bucket(Bucket=bucket)
    put = lambda key, body, **kw: s3.put_object(Bucket=bucket, Key=key, Body=body, **kw)
    row("PutObject If-None-Match: * (key absent)", lambda: put("a", b"one", IfNoneMatch="*"))
    row("PutObject If-None-Match: * (key present)", lambda: put("a", b"two", IfNoneMatch="*"))
    etag = s3.head_object(Bucket=bucket, Key="a")["ETag"]
    row("PutObject If-Match: wrong ETag", lambda: put("a", b"x", IfMatch=WRONG_ETAG))
    row("PutObject If-Match: current ETag", lambda: put("a", b"three", IfMatch=etag))
    row("PutObject If-Match: stale ETag", lambda: put("a", b"four", IfMatch=etag))
    row("PutObject If-Match: ETag, key absent", lambda: put("absent", b"x", IfMatch=etag))
    rows.append(("  body afterwards", s3.get_object(Bucket=bucket, Key="a")["Body"].read().decode()))

    copy = lambda key, **kw: s3.copy_object(Bucket=bucket, Key=key, CopySource={"Bucket": bucket, "Key": "a"}, **kw)
    row("CopyObject If-None-Match: * (target absent)", lambda: copy("c", IfNoneMatch="*"))
    row("CopyObject If-None-Match: * (target present)", lambda: copy("c", IfNoneMatch="*"))
    row("CopyObject x-amz-copy-source-if-match: wrong", lambda: copy("d", CopySourceIfMatch=WRONG_ETAG))
    current = s3.head_object(Bucket=bucket, Key="a")["ETag"]
    row("CopyObject x-amz-copy-source-if-none-match: current", lambda: copy("d", CopySourceIfNoneMatch=current))

    def multipart(key, copy_from=None, **cond):
        up = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        if copy_from:
            r = s3.upload_part_copy(Bucket=bucket, Key=key, UploadId=up, PartNumber=1, CopySource={"Bucket": bucket, "Key": copy_from})
            parts = [{"PartNumber": 1, "ETag": r["CopyPartResult"]["ETag"]}]
        else:
            p1 = s3.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=1, Body=b"x" * (5 << 20))
            p2 = s3.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=2, Body=b"tail")
            parts = [{"PartNumber": 1, "ETag": p1["ETag"]}, {"PartNumber": 2, "ETag": p2["ETag"]}]
        try:
            return s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up, MultipartUpload={"Parts": parts}, **cond)
        except ClientError:
            s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=up)
            raise

    row("Multipart, complete without condition", lambda: multipart("m1"))
    row("Multipart, complete If-None-Match: * (key absent)", lambda: multipart("m2", IfNoneMatch="*"))
    row("Multipart, complete If-None-Match: * (key present)", lambda: multipart("m2", IfNoneMatch="*"))
    row("Multipart, complete If-Match: wrong ETag", lambda: multipart("m2", IfMatch=WRONG_ETAG))
    row("UploadPartCopy + complete If-None-Match: * (absent)", lambda: multipart("cp", copy_from="a", IfNoneMatch="*"))
    row("UploadPartCopy + complete If-None-Match: * (present)", lambda: multipart("cp", copy_from="a", IfNoneMatch="*"))
    rows.append(("  multipart uploads left open", str(len(s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])))))

    data = bytes(range(256)) * 4
    s3.put_object(Bucket=bucket, Key="r", Body=data)
    for rng, want in [("bytes=10-19", data[10:20]), ("bytes=-5", data[-5:]), ("bytes=1020-", data[1020:])]:
        r = s3.get_object(Bucket=bucket, Key="r", Range=rng)
        ok = r["Body"].read() == want
        rows.append((f"GetObject Range: {rng}", f"{r['ResponseMetadata']['HTTPStatusCode']} {r.get('ContentRange')} bytes {'right' if ok else 'WRONG'}"))
    row("GetObject Range: bytes=5000-5010 (past the end)", lambda: s3.get_object(Bucket=bucket, Key="r", Range="bytes=5000-5010"))
    row("GetObject, key absent", lambda: s3.get_object(Bucket=bucket, Key="nope"))
    row("HeadObject, key absent", lambda: s3.head_object(Bucket=bucket, Key="nope"))

    for k in ["ds/b/data/y.lance", "ds/top.json", "ds/a/_versions/1.manifest", "ds/a/data/x.lance", "ds/A", "other"]:
        s3.put_object(Bucket=bucket, Key=k, Body=b"k")
    r = s3.list_objects_v2(Bucket=bucket, Prefix="ds/", Delimiter="/")
    rows.append(("ListObjectsV2 prefix ds/, delimiter /", json.dumps([[c["Key"] for c in r.get("Contents", [])], [p["Prefix"] for p in r.get("CommonPrefixes", [])]])))
    keys = [c["Key"] for c in s3.list_objects_v2(Bucket=bucket, Prefix="ds/")["Contents"]]
    rows.append(("ListObjectsV2 prefix ds/: byte order", f"{keys == sorted(keys)} {json.dumps(keys)}"))
    for i in range(1500):
        s3.put_object(Bucket=bucket, Key=f"many/{i:05d}", Body=b"")
    first = s3.list_objects_v2(Bucket=bucket, Prefix="many/")
    second = s3.list_objects_v2(Bucket=bucket, Prefix="many/", ContinuationToken=first["NextContinuationToken"])
    rows.append(("ListObjectsV2 of 1500 keys: pages", f"{first['KeyCount']} (truncated {first['IsTruncated']}), {second['KeyCount']} (truncated {second['IsTruncated']})"))
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "ds/a/data/x.lance"}, {"Key": "ds/b/data/y.lance"}, {"Key": "absent"}]})
    left = [c["Key"] for c in s3.list_objects_v2(Bucket=bucket, Prefix="ds/")["Contents"]]
    rows.append(("DeleteObjects (2 present, 1 absent)", f"{r['ResponseMetadata']['HTTPStatusCode']} deleted {len(r.get('Deleted', []))}, errors {len(r.get('Errors', []))}, left {json.dumps(left)}"))
    row("DeleteObject If-Match: wrong ETag", lambda: s3.delete_object(Bucket=bucket, Key="ds/top.json", IfMatch=WRONG_ETAG))
    return rows


def races(endpoint, bucket, rounds, mode, clients=8):
    """Winners per round of `clients` writing one key at once, conditionally."""
    s3s = [client(endpoint) for _ in range(clients)]
    s3s[0].create_bucket(Bucket=bucket)
    hist = {}
    for t in range(rounds):
        key = f"race/{t}"
        cond = {"IfNoneMatch": "*"}
        if mode == "If-Match":
            cond = {"IfMatch": s3s[0].put_object(Bucket=bucket, Key=key, Body=b"base")["ETag"]}
        barrier = threading.Barrier(clients)

        def one(i):
            barrier.wait()
            return status(lambda: s3s[i].put_object(Bucket=bucket, Key=key, Body=b"%d" % i, **cond))[0]

        with cf.ThreadPoolExecutor(clients) as ex:
            codes = list(ex.map(one, range(clients)))
        wins = codes.count(200)
        assert all(c in (200, 412) for c in codes), codes
        hist[wins] = hist.get(wins, 0) + 1
    return hist


def kills():
    """What a client sees when the server is killed with SIGKILL during a GET, during a PUT, and after."""
    rows = []
    big = os.urandom(1 << 20) * 200
    endpoint, pid, _ = start_server()
    s3 = client(endpoint)
    s3.put_object(Bucket="lake", Key="big", Body=big)
    body = s3.get_object(Bucket="lake", Key="big")["Body"]
    got = len(body.read(8 << 20))
    killed = time.time()
    os.kill(pid, signal.SIGKILL)
    try:
        while chunk := body.read(1 << 20):
            got += len(chunk)
        rows.append(("GET of 200 MiB, killed after 8 MiB", f"ended without an error after {got} bytes"))
    except Exception as e:
        rows.append(("GET of 200 MiB, killed after 8 MiB", f"{type(e).__name__} after {got} bytes, {time.time() - killed:.2f} s after the kill"))

    endpoint, pid, _ = start_server()
    s3 = client(endpoint)
    outcome = {}

    def put():
        try:
            s3.put_object(Bucket="lake", Key="big", Body=big)
            outcome["what"] = "succeeded"
        except Exception as e:
            outcome["what"] = type(e).__name__
        outcome["at"] = time.time()

    th = threading.Thread(target=put)
    th.start()
    time.sleep(0.3)
    killed = time.time()
    os.kill(pid, signal.SIGKILL)
    th.join()
    rows.append(("PUT of 200 MiB, killed 0.3 s in", f"{outcome['what']}, {outcome['at'] - killed:.2f} s after the kill"))
    asked = time.time()
    code = "answered"
    try:
        s3.head_object(Bucket="lake", Key="big")
    except Exception as e:
        code = type(e).__name__
    rows.append(("HEAD after the kill", f"{code} in {time.time() - asked:.3f} s"))
    endpoint, pid, _ = start_server()
    rows.append(("a new server's bucket holds", f"{client(endpoint).list_objects_v2(Bucket='lake')['KeyCount']} keys"))
    os.kill(pid, signal.SIGTERM)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200, help="rounds of each race (default 200)")
    parser.add_argument("--endpoint", help="probe this server instead of starting one")
    args = parser.parse_args()
    pid = None
    if args.endpoint:
        endpoint = args.endpoint
    else:
        starts = []
        for _ in range(3):
            endpoint, pid, took = start_server()
            starts.append(took)
            os.kill(pid, signal.SIGTERM)
        print(f"start (scripts/s3-server.sh until it answers): {', '.join(f'{s:.2f} s' for s in starts)}")
        endpoint, pid, _ = start_server()
    stamp = str(os.getpid())
    for what, result in conformance(client(endpoint), f"probe-{stamp}"):
        print(f"{what:56s} {result}")
    for mode in ["If-None-Match", "If-Match"]:
        hist = races(endpoint, f"race-{mode.lower()}-{stamp}", args.rounds, mode)
        print(f"8 clients racing PutObject {mode}, winners per round: {json.dumps(hist)} ({args.rounds} rounds)")
    if pid:
        os.kill(pid, signal.SIGTERM)
        for what, result in kills():
            print(f"{what:56s} {result}")


if __name__ == "__main__":
    main()
