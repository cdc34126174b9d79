"""The admin pages: the login portal on the API port and the dashboard.

The composition root builds the portal with `create_admin_portal(...)` and hands
it to the router's app as `admin_portal`; the router passes every `/admin` path
to it. The dashboard's routes come from `create_dashboard_routes(sources=...)`
and go into the admin app's extra routes, so both the admin listener and,
behind the login, the portal serve them. `DashboardSources` is what the
dashboard reads and changes, as callables over the real services.

Not guaranteed: anything about the admin listener itself; it is served by the
router package and guarded there.
"""

from llmgw.web.dashboard import create_dashboard_routes, is_dashboard_path
from llmgw.web.portal import AdminPortal, create_admin_portal
from llmgw.web.sources import (
    ActionError,
    DashboardSources,
    HistorySource,
    KeyManager,
    UsageSource,
)

__all__ = [
    "ActionError",
    "AdminPortal",
    "DashboardSources",
    "HistorySource",
    "KeyManager",
    "UsageSource",
    "create_admin_portal",
    "create_dashboard_routes",
    "is_dashboard_path",
]
