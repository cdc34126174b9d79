"""Admin API for the config file: `POST /admin/api/config/reload` reloads its models.

The same as `llmgw models reload` and SIGHUP to the server (see
`control.catalog.reload`). The answer lists the models added, changed (and of
those, `rolled`: whose replicas roll to the new spec), removed and unchanged, and
`restart_needed`: the file's other sections that changed since start-up, which a
reload does not apply. A file that does not read or validate answers 400
`invalid_config`, naming the file and the field, and changes nothing; a server
started without --config answers 409 `no_config_file`.

Not guaranteed: that the replicas have rolled when the answer comes; it says what
the catalog holds now, and `llmgw models rollout status` follows the roll.
"""

from __future__ import annotations

from typing import Protocol

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from llmgw.control.adminapi.responses import error_response, json_response
from llmgw.control.catalog.errors import CatalogError
from llmgw.control.catalog.reload import NoConfigFile, Reloaded
from llmgw.store import StoreError, StoreUnavailable


class Reloader(Protocol):
    """What the route needs; `control.catalog.reload.ConfigReloader` satisfies it."""

    async def reload(self) -> Reloaded: ...


def config_routes(*, reloader: Reloader) -> list[Route]:
    """The config file's routes under /admin/api/config."""

    async def reload(request: Request) -> Response:
        try:
            done = await reloader.reload()
        except NoConfigFile as exc:
            return error_response(409, exc.message, code=exc.code)
        except CatalogError as exc:
            return error_response(400, exc.message, code=exc.code, param="config")
        except StoreUnavailable as exc:
            return error_response(503, str(exc), code="store_unavailable")
        except StoreError as exc:
            return error_response(500, str(exc), code="store_error")
        return json_response(done.view())

    return [Route("/admin/api/config/reload", reload, methods=["POST"])]
