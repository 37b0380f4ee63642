-- Identity-provider shapes (issue 17).
--
-- idp_mappings: the admins' table from claim values to Allot roles. Each
-- rule reads one claim (groups, roles, or any other), matches its values
-- exactly, as a Keycloak-style group path, as a GUID (Entra ID), or with a
-- glob/regex pattern that may capture the team ({team}), and grants admin,
-- finance, or membership/lead of a fixed or captured team. No rules: the
-- built-in mapping of the --oidc-* flags is in force.
CREATE TABLE idp_mappings (
    id          bigserial PRIMARY KEY,
    claim       text NOT NULL CHECK (claim <> '' AND length(claim) <= 200),
    match       text NOT NULL CHECK (match IN ('exact', 'path', 'guid', 'glob', 'regex')),
    pattern     text NOT NULL CHECK (pattern <> '' AND length(pattern) <= 500),
    grant_role  text NOT NULL CHECK (grant_role IN ('admin', 'finance', 'member', 'lead')),
    team        text NOT NULL DEFAULT '',
    updated_at  timestamptz NOT NULL,
    updated_by  text NOT NULL,
    UNIQUE (claim, match, pattern, grant_role, team)
);

-- What recent sign-ins sent (claim names and counts of values, never the
-- values or tokens), so the admin page can warn when the provider sends
-- nothing the mapping can use, sends Entra ID's groups overage marker, or
-- a sign-in waits for an admin to link it to an account. Kept short.
CREATE TABLE oidc_sign_ins (
    id            bigserial PRIMARY KEY,
    at            timestamptz NOT NULL,
    issuer        text NOT NULL,
    subject       text NOT NULL,
    email         text NOT NULL,
    outcome       text NOT NULL CHECK (outcome IN ('signed_in', 'link_required', 'linked', 'refused')),
    detail        text NOT NULL DEFAULT '',
    claim_names   text[] NOT NULL DEFAULT '{}',
    claim_counts  jsonb NOT NULL DEFAULT '{}',
    matched       integer NOT NULL DEFAULT 0,
    overage       boolean NOT NULL DEFAULT false,
    roles         text NOT NULL DEFAULT ''
);
CREATE INDEX oidc_sign_ins_at ON oidc_sign_ins (at DESC, id DESC);

-- People are keyed by (issuer, subject): a subject is only unique within
-- its issuer. Rows from before this migration have issuer '' and are
-- adopted by the issuer at their next sign-in when the email matches.
ALTER TABLE users ADD COLUMN oidc_issuer text NOT NULL DEFAULT '';
ALTER TABLE users DROP CONSTRAINT users_oidc_subject_key;
ALTER TABLE users ADD CONSTRAINT users_oidc_identity_key UNIQUE (oidc_issuer, oidc_subject);
