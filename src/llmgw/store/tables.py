"""SQLAlchemy Core tables of the store: the schema the queries are written against.

The migrations in `migrations/versions/` create this schema; a unit test compares
the migrated database with this metadata, so the two cannot drift apart silently.
Only modules inside `llmgw.store` import this file. `metadata` is built once at
import and never changed afterwards; it describes the schema, it holds no data.

Not guaranteed: foreign keys from usage to keys. Usage rows keep a `key_id`
without a constraint, so recording usage never fails because of a key that was
just created on another server and not yet visible, and keys are never deleted
(only revoked), so the ids stay meaningful.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    text,
)
from sqlalchemy.types import TypeDecorator

from llmgw.store.errors import InvalidValue
from llmgw.store.models import MAX_END_USER_CHARS, MAX_MODEL_CHARS

# Deterministic constraint names, so later migrations can refer to them on PostgreSQL.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every database.

    PostgreSQL stores `timestamptz`; SQLite has no time zones, so the value is
    converted to UTC and stored naive (SQLAlchemy's fixed-width text format, which
    sorts and compares correctly as text), and read back as UTC. Naive datetimes
    are refused rather than guessed at.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise InvalidValue(f"datetime {value.isoformat()} has no time zone; pass UTC")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


# SQLite only auto-increments an INTEGER PRIMARY KEY (the rowid alias), not BIGINT.
AutoIncrementId = BigInteger().with_variant(Integer(), "sqlite")

metadata = MetaData(naming_convention=NAMING_CONVENTION)

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("name", String(200), nullable=False),
    Column("prefix", String(32), nullable=False, index=True),
    Column("secret_hash", String(64), nullable=False, unique=True, index=True),
    Column("models", JSON(none_as_null=True), nullable=True),
    Column("rpm", Integer, nullable=True),
    Column("tpm", Integer, nullable=True),
    Column("budget_tokens", BigInteger, nullable=True),
    Column("budget_period", String(8), nullable=True),
    Column("expires_at", UTCDateTime, nullable=True),
    Column("is_admin", Boolean, nullable=False),
    # admin, operator or viewer (llmgw.auth.roles); NULL: a client key.
    Column("admin_role", String(16), nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False, index=True),
    Column("revoked_at", UTCDateTime, nullable=True),
    Column("priority", String(16), nullable=False, server_default="default"),
    Column("weight", Float, nullable=False, server_default="1"),
    Column("max_queue_wait", Float, nullable=True),
    # What the key may do besides calling models (e.g. ["debug"]); NULL: nothing.
    Column("scopes", JSON(none_as_null=True), nullable=True),
    # The team the key belongs to (teams.id); NULL: none.
    Column("team_id", String(32), nullable=True, index=True),
    # Limits per end user of the key's application (the `user` a request names):
    # requests and tokens per minute, tokens per UTC day. NULL: no limit.
    Column("user_rpm", Integer, nullable=True),
    Column("user_tpm", Integer, nullable=True),
    Column("user_budget_tokens", BigInteger, nullable=True),
    CheckConstraint("budget_period IN ('day', 'month')", name="budget_period"),
    # Names are unique among keys that still work; a revoked key frees its name.
    Index(
        "uq_api_keys_active_name",
        "name",
        unique=True,
        sqlite_where=text("revoked_at IS NULL"),
        postgresql_where=text("revoked_at IS NULL"),
    ),
)

usage_records = Table(
    "usage_records",
    metadata,
    Column("id", AutoIncrementId, primary_key=True, autoincrement=True),
    Column("ts", UTCDateTime, nullable=False, index=True),
    Column("request_id", String(200), nullable=False),
    Column("key_id", String(32), nullable=True),
    Column("model", String(MAX_MODEL_CHARS), nullable=False),
    Column("endpoint", String(200), nullable=False),
    Column("status", Integer, nullable=False),
    Column("prompt_tokens", Integer, nullable=False),
    Column("completion_tokens", Integer, nullable=False),
    Column("latency_ms", Float, nullable=False),
    Column("ttft_ms", Float, nullable=True),
    Column("streamed", Boolean, nullable=False),
    Column("queue_ms", Float, nullable=True),
    Column("route", String(64), nullable=True),
    Column("continued", Integer, nullable=True),
    Column("version", String(64), nullable=True),
    # The end user the request named (`user`, Anthropic `metadata.user_id`); NULL: none.
    Column("end_user", String(MAX_END_USER_CHARS), nullable=True),
)


def _usage_rollup(name: str, period: str) -> Table:
    """Requests summed per `period` ("hour" or "day": its UTC start), key and model."""
    return Table(
        name,
        metadata,
        Column(period, UTCDateTime, nullable=False),
        # '' rather than NULL for "no key": NULLs never collide in a primary key.
        Column("key_id", String(32), nullable=False),
        Column("model", String(MAX_MODEL_CHARS), nullable=False),
        Column("requests", BigInteger, nullable=False),
        Column("errors", BigInteger, nullable=False),
        Column("prompt_tokens", BigInteger, nullable=False),
        Column("completion_tokens", BigInteger, nullable=False),
        Column("latency_ms_sum", Float, nullable=False),
        PrimaryKeyConstraint(period, "key_id", "model"),
        # tokens_used reads one key over a time range.
        Index(f"ix_{name}_key_id_{period}", "key_id", period),
    )


usage_hourly = _usage_rollup("usage_hourly", "hour")

# Requests that named an end user, summed per UTC hour, key, end user and model: the
# report by end user, and end-user budgets (one key's end user over a day). Requests
# without an end user are not in it.
usage_end_users = Table(
    "usage_end_users",
    metadata,
    Column("hour", UTCDateTime, nullable=False),
    Column("key_id", String(32), nullable=False),
    Column("end_user", String(MAX_END_USER_CHARS), nullable=False),
    Column("model", String(MAX_MODEL_CHARS), nullable=False),
    Column("requests", BigInteger, nullable=False),
    Column("errors", BigInteger, nullable=False),
    Column("prompt_tokens", BigInteger, nullable=False),
    Column("completion_tokens", BigInteger, nullable=False),
    Column("latency_ms_sum", Float, nullable=False),
    PrimaryKeyConstraint("hour", "key_id", "end_user", "model"),
    # An end-user budget reads one key's end user over a day.
    Index("ix_usage_end_users_key_id_end_user_hour", "key_id", "end_user", "hour"),
)
# The same sums per UTC day: reports over whole days read these, 24x fewer rows
# than the hours when traffic is steady (`UsageRepository.query` splits a range).
usage_daily = _usage_rollup("usage_daily", "day")

# The base model of each LoRA adapter that requests were recorded for (as the catalog
# had it at its latest request), so reports by model can say it; one row per adapter.
usage_bases = Table(
    "usage_bases",
    metadata,
    Column("model", String(MAX_MODEL_CHARS), primary_key=True),
    Column("base", String(MAX_MODEL_CHARS), nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
)

catalog_models = Table(
    "catalog_models",
    metadata,
    # The model's name as clients send it (the config layer allows up to 128 characters).
    Column("name", String(128), primary_key=True),
    # The whole model as the catalog writes it; the store neither reads nor checks it.
    Column("spec", JSON, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    # The spec before the last replacement, for `llmgw models rollout undo` (NULL: none).
    Column("previous_spec", JSON, nullable=True),
)

leases = Table(
    "leases",
    metadata,
    # One row per lease; the control plane's is named "control".
    Column("name", String(64), primary_key=True),
    # The server holding it (its id, e.g. host:pid) and the epoch, raised on every
    # change of owner: the fencing token every leader write carries.
    Column("owner", String(200), nullable=False),
    Column("epoch", BigInteger, nullable=False),
    Column("acquired_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    # Where agents reach the holder; standbys name it when they refuse an agent.
    Column("agent_address", String(300), nullable=False),
)

replica_endpoints = Table(
    "replica_endpoints",
    metadata,
    Column("model", String(128), nullable=False),
    Column("replica_id", String(128), nullable=False),
    Column("url", String(500), nullable=False),
    # The model's name and aliases, as the router serves them.
    Column("names", JSON, nullable=False),
    # For a LoRA adapter's row: the base model whose replica it is (its placement
    # record's model); NULL for a model's own replicas.
    Column("base", String(128), nullable=True),
    # The epoch of the leader that wrote the row.
    Column("epoch", BigInteger, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    PrimaryKeyConstraint("model", "replica_id"),
)

fleet_nodes = Table(
    "fleet_nodes",
    metadata,
    # Each node as the leader's inventory shows it, so a standby's admin API can
    # show the fleet as the leader sees it (standbys have no agent streams).
    Column("node_id", String(253), primary_key=True),
    # The node's admin API view; the store neither reads nor checks it.
    Column("view", JSON, nullable=False),
    # The epoch of the leader that wrote the row.
    Column("epoch", BigInteger, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
)

model_demand = Table(
    "model_demand",
    metadata,
    # What each server's router saw of a model: the leader scales on the sum.
    Column("model", String(128), nullable=False),
    Column("server", String(200), nullable=False),
    Column("last_active", UTCDateTime, nullable=False),
    Column("in_flight", Integer, nullable=False),
    # Set while a request on that server waits for the model to start.
    Column("wanted_at", UTCDateTime, nullable=True),
    # Load signals for target_queue_depth / target_kv_use: requests waiting in that
    # server's router queue, the longest wait (s), and its engine reads per replica
    # (a list of {replica, waiting, running, kv_cache_usage, read_at}; the store
    # neither reads nor checks it).
    Column("queued", Integer, nullable=False, server_default="0"),
    Column("queue_wait", Float, nullable=False, server_default="0"),
    Column("replicas", JSON, nullable=True),
    PrimaryKeyConstraint("model", "server"),
)

control_servers = Table(
    "control_servers",
    metadata,
    # Every `llmgw server` on this store, announced every third of the lease TTL;
    # the leader counts demand only from servers announced within one TTL.
    Column("server", String(200), primary_key=True),
    Column("hostname", String(255), nullable=False),
    Column("version", String(64), nullable=False),
    Column("api_url", String(300), nullable=False),
    # Where agents dial this server; empty when it has no agent listener.
    Column("agent_address", String(300), nullable=False),
    Column("started_at", UTCDateTime, nullable=False),
    Column("last_seen", UTCDateTime, nullable=False),
)

teams = Table(
    "teams",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("name", String(64), nullable=False, unique=True),
    Column("rpm", Integer, nullable=True),
    Column("tpm", Integer, nullable=True),
    Column("budget_tokens", BigInteger, nullable=True),
    Column("budget_period", String(8), nullable=True),
    Column("models", JSON(none_as_null=True), nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    CheckConstraint("budget_period IN ('day', 'month')", name="team_budget_period"),
)

team_members = Table(
    "team_members",
    metadata,
    Column("team_id", String(32), primary_key=True),
    Column("user_name", String(64), primary_key=True),
    # team-admin or member
    Column("role", String(16), nullable=False),
    Column("added_at", UTCDateTime, nullable=False),
)

users = Table(
    "users",
    metadata,
    Column("id", String(32), primary_key=True),
    # Names are unique for good: a disabled user keeps its name, so an audit trail
    # that names a user never points at someone else later.
    Column("name", String(64), nullable=False, unique=True),
    # The whole argon2 encoding ($argon2id$v=19$m=...,t=...,p=...$salt$hash).
    Column("password_hash", String(255), nullable=False),
    Column("admin", Boolean, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("disabled_at", UTCDateTime, nullable=True),
    # admin, operator or viewer (llmgw.auth.roles); NULL: may log in but see nothing.
    Column("admin_role", String(16), nullable=True),
    # Users who sign in through OpenID Connect: the provider's issuer and the
    # user's `sub` there (the only stable identity; e-mails change). NULL for
    # local users. Such users have no password (an empty password_hash).
    Column("sso_issuer", String(255), nullable=True),
    Column("sso_subject", String(255), nullable=True),
    Index("ix_users_sso", "sso_issuer", "sso_subject", unique=True),
)

oidc_logins = Table(
    "oidc_logins",
    metadata,
    # SHA-256 (hex) of the `state` sent to the provider: a copy of the database
    # does not let anyone finish a sign-in that is under way.
    Column("id", String(64), primary_key=True),
    Column("nonce", String(128), nullable=False),
    Column("code_verifier", String(128), nullable=False),
    Column("redirect_uri", String(1024), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False, index=True),
)

admin_sessions = Table(
    "admin_sessions",
    metadata,
    # SHA-256 (hex) of the cookie's token; the token itself is never stored.
    Column("id", String(64), primary_key=True),
    Column(
        "user_id",
        String(32),
        ForeignKey("users.id", ondelete="CASCADE"),
        nullable=False,
        index=True,
    ),
    Column("csrf_token", String(64), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False, index=True),
    Column("last_seen_at", UTCDateTime, nullable=False),
)

cluster_cas = Table(
    "cluster_cas",
    metadata,
    # SHA-256 (hex) of the CA certificate's SubjectPublicKeyInfo: what join tokens carry.
    Column("id", String(64), primary_key=True),
    # "active" issues; "next" is a rotation's new CA, trusted but not yet issuing;
    # "retired" is kept so certificates it issued verify until they expire.
    Column("role", String(16), nullable=False),
    Column("cert_pem", Text, nullable=False),
    # The CA's PKCS#8 private key sealed with AES-256-GCM under the cluster key
    # (a file each server holds, never stored here): nonce || ciphertext || tag.
    Column("key_sealed", LargeBinary, nullable=False),
    # SHA-256 (hex) of a value derived from the cluster key, so a server holding
    # another key file says so instead of failing to decrypt.
    Column("sealing_key_id", String(64), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("not_after", UTCDateTime, nullable=False),
    Column("retired_at", UTCDateTime, nullable=True),
    CheckConstraint("role IN ('active', 'next', 'retired')", name="role"),
    # One active CA and at most one next: the first server to insert wins, the
    # others get an IntegrityError and read the winner's row.
    Index(
        "uq_cluster_cas_role",
        "role",
        unique=True,
        sqlite_where=text("role <> 'retired'"),
        postgresql_where=text("role <> 'retired'"),
    ),
)

join_tokens = Table(
    "join_tokens",
    metadata,
    Column("id", String(32), primary_key=True),
    # SHA-256 (hex) of the token's secret; the secret itself is never stored.
    Column("secret_hash", String(64), nullable=False),
    # A self-signed certificate for the key derived from the secret: servers trust
    # it for client certificates until the token is spent, so a joining agent
    # proves it holds the secret in the TLS handshake (public; no secret in it).
    Column("root_pem", Text, nullable=False),
    # Labels given to every node that joins with the token; the node keeps them
    # (`node_identities.labels`): what its agent declares cannot change them.
    Column("labels", JSON, nullable=False),
    # Fabric labels fixed the same way (multi-node placement groups nodes by them);
    # NULL on tokens made before they could be fixed.
    Column("fabric", JSON, nullable=True),
    Column("max_uses", Integer, nullable=True),
    Column("uses", Integer, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    Column("last_used_at", UTCDateTime, nullable=True),
    Column("revoked_at", UTCDateTime, nullable=True),
)

issued_certificates = Table(
    "issued_certificates",
    metadata,
    # The certificate's serial number in hex: unique per CA (random, 159 bits).
    Column("serial", String(64), primary_key=True),
    Column("kind", String(16), nullable=False),
    # The node id (kind "node") or the server id (kind "server").
    Column("subject", String(255), nullable=False),
    Column("ca_id", String(64), nullable=False),
    # SHA-256 (hex) of the certificate's SubjectPublicKeyInfo.
    Column("spki_sha256", String(64), nullable=False),
    # The join token a node's first certificate was issued for; NULL for renewals.
    Column("token_id", String(32), nullable=True),
    Column("issued_at", UTCDateTime, nullable=False),
    Column("not_after", UTCDateTime, nullable=False),
    CheckConstraint("kind IN ('server', 'node')", name="kind"),
    Index("ix_issued_certificates_kind_subject", "kind", "subject"),
)

node_identities = Table(
    "node_identities",
    metadata,
    # A node id belongs to the key that first registered under it (`store.nodeids`).
    Column("node_id", String(253), primary_key=True),
    # SHA-256 (hex) of the owning certificate's SubjectPublicKeyInfo.
    Column("key_hash", String(64), nullable=False, index=True),
    Column("bound_at", UTCDateTime, nullable=False),
    Column("last_seen_at", UTCDateTime, nullable=False),
    # The labels and fabric labels of the join token the node joined with: they
    # bind (the agent may add keys, never change these). NULL: none bound (a
    # certificate of the operator's own PKI).
    Column("labels", JSON, nullable=True),
    Column("fabric", JSON, nullable=True),
)

node_revocations = Table(
    "node_revocations",
    metadata,
    # The deny-list: keys of removed nodes, checked at every Register; never deleted.
    Column("key_hash", String(64), primary_key=True),
    Column("node_id", String(253), nullable=False),
    Column("revoked_at", UTCDateTime, nullable=False),
    Column("reason", String(500), nullable=False),
)

placements = Table(
    "placements",
    metadata,
    # What the leader placed where, written before it sends the start (`store.placements`):
    # a node's report of a shard is adopted and published only if it matches one.
    Column("shard_id", String(128), primary_key=True),
    # The replica the shard belongs to (rank 0's shard id; its own for one node).
    Column("replica_id", String(128), nullable=False),
    Column("node_id", String(253), nullable=False, index=True),
    Column("model", String(128), nullable=False),
    Column("profile", String(128), nullable=False),
    Column("port", Integer, nullable=False),
    Column("node_rank", Integer, nullable=False),
    Column("nodes", Integer, nullable=False),
    # The whole start command's spec, as the control plane reads it back.
    Column("spec", JSON, nullable=False),
    # The epoch of the leader that wrote the row.
    Column("epoch", BigInteger, nullable=False),
    Column("placed_at", UTCDateTime, nullable=False),
)

rollout_halts = Table(
    "rollout_halts",
    metadata,
    # A model whose rollout stopped because a replica of the new spec failed; the
    # next leader keeps it stopped (`store.rollouts`).
    Column("model", String(128), primary_key=True),
    # Which spec's rollout stopped: a later change to the model starts afresh.
    Column("spec_key", String(64), nullable=False),
    Column("reason", Text, nullable=False),
    Column("halted_at", UTCDateTime, nullable=False),
)

canary_halts = Table(
    "canary_halts",
    metadata,
    # A model whose canary stopped because one of its replicas failed; the next
    # leader keeps it stopped (`store.rollouts`).
    Column("model", String(128), primary_key=True),
    # Which canary spec stopped: a changed canary (or none) ends the stop.
    Column("spec_key", String(64), nullable=False),
    Column("reason", Text, nullable=False),
    Column("halted_at", UTCDateTime, nullable=False),
)
