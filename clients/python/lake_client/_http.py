"""JSON requests to `lake serve`'s HTTP port (`--http`), with the standard library only.

Every way a request can fail ends as a `LakeError`: a refusal carries the server's message and
its code, an unreachable address says to give the HTTP port, and an answer that breaks off after
its first rows (the server failed while streaming it, and logged why) says so instead of
surfacing as a half-read body.
"""

from __future__ import annotations

from http.client import HTTPException, IncompleteRead
import json
import urllib.error
import urllib.request
from typing import Any, Dict, Optional

from lake_client import LakeError

# The codes of lake's HTTP refusals, as `LakeError` codes (serving.md, "Errors").
_CODES = {400: "bad_request", 401: "unauthorized", 404: "not_found", 503: "busy"}


def http_json(http: str, method: str, path: str, token: Optional[str], body: Optional[bytes] = None,
              headers: Optional[Dict[str, str]] = None, timeout_s: float = 60) -> Any:
    """The JSON answer of one request to the server's HTTP port `http` (`HOST:PORT` or a URL)."""
    url = http.rstrip("/") + path
    if "://" not in http:
        url = "http://" + url
    request = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            text = answer.read()
    except urllib.error.HTTPError as e:
        try:
            message = json.loads(e.read()).get("error", str(e))
        except (ValueError, AttributeError, OSError, HTTPException):
            message = str(e)
        raise LakeError(_CODES.get(e.code, "internal"), f"{method} {path}: {message}") from e
    except IncompleteRead as e:
        # The 200 went out with the first rows; the server logged the error that ended the rest.
        raise LakeError(
            "internal",
            f"{method} {path}: the answer broke off after {len(e.partial)} bytes: the server failed "
            "while streaming it (its log says why)",
        ) from e
    except (urllib.error.URLError, OSError, HTTPException) as e:
        raise LakeError("unavailable", f"{method} {url}: {e} (give lake serve's --http address)") from e
    try:
        return json.loads(text)
    except ValueError as e:
        raise LakeError("internal", f"{method} {path}: the answer is not JSON ({e})") from e
