-- Tokens (issue 12): node tokens record when they were last used and who
-- revoked them; an API token made with another API token remembers its
-- parent, so revoking a token revokes the tokens it made; an admin can
-- disable a person (no sign-in, no tokens, no sessions until enabled).

ALTER TABLE node_tokens
    ADD COLUMN last_used_at timestamptz,
    ADD COLUMN revoked_by   text NOT NULL DEFAULT '';

CREATE INDEX node_tokens_node_idx ON node_tokens (node, created_at DESC);

ALTER TABLE api_tokens
    ADD COLUMN parent_token_id bigint REFERENCES api_tokens(id) ON DELETE CASCADE,
    ADD CONSTRAINT api_tokens_parent_not_self CHECK (parent_token_id <> id);

CREATE INDEX api_tokens_parent_idx ON api_tokens (parent_token_id) WHERE parent_token_id IS NOT NULL;

ALTER TABLE users
    ADD COLUMN disabled_at timestamptz,
    ADD COLUMN disabled_by text NOT NULL DEFAULT '';
