"""The dashboard's static files (htmx, the stylesheet), served from the package itself.

Nothing is fetched from the internet: the files ship inside the `llmgw.web`
package and are read once, when the dashboard's routes are built. Each URL
carries a hash of the file (`?v=...`), so browsers may keep a file for a year
and still get a new one the moment an upgrade changes it.

Not guaranteed: serving anything but the files listed in `FILES`; every other
name is a 404, whatever the path holds.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.resources import files

from starlette.requests import Request
from starlette.responses import Response

from llmgw.web.http import error_response

FILES: dict[str, str] = {
    "htmx.min.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
}
LONG_CACHE = "public, max-age=31536000, immutable"


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    media_type: str
    etag: str


class StaticAssets:
    """The files of `FILES`, read from the package when built."""

    def __init__(self) -> None:
        folder = files("llmgw.web").joinpath("static")
        self._assets: dict[str, Asset] = {}
        for name, media_type in FILES.items():
            body = folder.joinpath(name).read_bytes()
            digest = hashlib.sha256(body).hexdigest()[:16]
            self._assets[name] = Asset(body, media_type, f'"{digest}"')

    def url(self, name: str) -> str:
        """The file's URL, with its hash as the cache key."""
        return f"/admin/static/{name}?v={self._assets[name].etag.strip(chr(34))}"

    async def serve(self, request: Request) -> Response:
        name = request.path_params["file"]
        asset = self._assets.get(name)
        if asset is None:
            return error_response(
                404,
                f"no static file {name!r}; the dashboard serves {', '.join(sorted(FILES))}",
                "invalid_request_error",
                "not_found",
            )
        headers = {
            "cache-control": LONG_CACHE,
            "etag": asset.etag,
            "x-content-type-options": "nosniff",
        }
        if request.headers.get("if-none-match") == asset.etag:
            return Response(status_code=304, headers=headers)
        return Response(asset.body, media_type=asset.media_type, headers=headers)
