"""The store: keys, usage, catalog, users and sessions in SQLite or PostgreSQL, via repositories.

The only package that writes SQL. It hands out frozen dataclasses (`ApiKey`,
`UsageRow`, ...) and raises only `StoreError` and its subclasses. Open it with
`open_store(store_url(data_dir, store))` in the composition root, apply
migrations with `await store.upgrade()`, and `await store.close()` at shutdown.

Not guaranteed: anything about the tables themselves; they are private to this
package and change through migrations.
"""

from llmgw.store.catalog import CatalogRepository, StoredModel
from llmgw.store.errors import (
    AlreadyExists,
    Ambiguous,
    BadStoreUrl,
    Conflict,
    InvalidValue,
    NotFound,
    StaleEpoch,
    StoreError,
    StoreUnavailable,
)
from llmgw.store.keys import KeyRepository
from llmgw.store.leadership import (
    ControlServer,
    Demand,
    FleetNode,
    LeadershipRepository,
    Lease,
    ModelLoad,
    PublishedEndpoint,
    ReplicaLoad,
)
from llmgw.store.models import (
    ADMIN_ROLES,
    KEEP,
    KEY_SCOPES,
    MAX_END_USER_CHARS,
    MAX_MODEL_CHARS,
    TEAM_ROLES,
    AdminRole,
    ApiKey,
    BudgetPeriod,
    Keep,
    KeyChanges,
    KeyPriority,
    KeyScope,
    NewApiKey,
    Team,
    TeamLimits,
    TeamMember,
    TeamRole,
    UsageDimension,
    UsageRecord,
    UsageRow,
    truncate_to_hour,
    utc_now,
)
from llmgw.store.nodeids import (
    BoundLabels,
    Claim,
    NodeBinding,
    NodeIdentityRepository,
    Revocation,
)
from llmgw.store.oidc_logins import OidcLoginRepository, PendingLogin
from llmgw.store.pki import (
    IssuedCertificate,
    PkiRepository,
    StoredCa,
    StoredJoinToken,
    TokenUnusable,
)
from llmgw.store.placements import PlacementRepository, StoredPlacement
from llmgw.store.rollouts import RolloutRepository, StoredHalt
from llmgw.store.store import Store, open_store, upgrade
from llmgw.store.teams import TeamRepository
from llmgw.store.urls import store_url
from llmgw.store.usage import UsageRepository
from llmgw.store.users import AdminSession, SessionRepository, User, UserRepository

__all__ = [
    "ADMIN_ROLES",
    "KEEP",
    "KEY_SCOPES",
    "MAX_END_USER_CHARS",
    "MAX_MODEL_CHARS",
    "TEAM_ROLES",
    "AdminRole",
    "AdminSession",
    "AlreadyExists",
    "Ambiguous",
    "ApiKey",
    "BadStoreUrl",
    "BoundLabels",
    "BudgetPeriod",
    "CatalogRepository",
    "Claim",
    "Conflict",
    "ControlServer",
    "Demand",
    "FleetNode",
    "InvalidValue",
    "IssuedCertificate",
    "Keep",
    "KeyChanges",
    "KeyPriority",
    "KeyRepository",
    "KeyScope",
    "LeadershipRepository",
    "Lease",
    "ModelLoad",
    "NewApiKey",
    "NodeBinding",
    "NodeIdentityRepository",
    "NotFound",
    "OidcLoginRepository",
    "PendingLogin",
    "PkiRepository",
    "PlacementRepository",
    "PublishedEndpoint",
    "ReplicaLoad",
    "Revocation",
    "RolloutRepository",
    "SessionRepository",
    "StaleEpoch",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "StoredCa",
    "StoredHalt",
    "StoredJoinToken",
    "StoredModel",
    "StoredPlacement",
    "Team",
    "TeamLimits",
    "TeamMember",
    "TeamRepository",
    "TeamRole",
    "TokenUnusable",
    "UsageDimension",
    "UsageRecord",
    "UsageRepository",
    "UsageRow",
    "User",
    "UserRepository",
    "open_store",
    "store_url",
    "truncate_to_hour",
    "upgrade",
    "utc_now",
]
