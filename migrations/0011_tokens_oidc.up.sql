-- Personal API tokens may expire; OIDC logins in flight are kept server-side
-- (state, nonce and PKCE verifier), each usable once and for a few minutes.

ALTER TABLE api_tokens
    ADD COLUMN expires_at timestamptz,
    ADD CONSTRAINT api_tokens_name_length CHECK (char_length(name) <= 100);

CREATE INDEX api_tokens_user_idx ON api_tokens (user_id, created_at DESC);

CREATE TABLE oidc_logins (
    state_hash  bytea PRIMARY KEY CHECK (length(state_hash) = 32),
    nonce       text NOT NULL CHECK (nonce <> ''),
    verifier    text NOT NULL CHECK (verifier <> ''),
    next        text NOT NULL DEFAULT '/',
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);
CREATE INDEX oidc_logins_expires_idx ON oidc_logins (expires_at);
