-- Who a job runs as, secret environment, image and limits (issue 12).
--
-- A job runs on its nodes as a POSIX account, never root, resolved at
-- submission from (in this order) the admin's mapping of the submitter
-- (users.posix_user), the identity provider's account claim at the
-- submitter's last sign-in (users.oidc_posix_user) and the team's service
-- account (teams.posix_account), and kept on the job (jobs.run_as_user;
-- jobs.run_as is the tier class a run started in). '' = none.
CREATE FUNCTION allot_posix_account_ok(name text) RETURNS boolean
    LANGUAGE sql IMMUTABLE AS $$
        SELECT name = '' OR (name ~ '^[a-z_][a-z0-9_-]{0,31}$'
            AND name NOT IN ('root', 'toor', 'daemon', 'bin', 'sys', 'sync', 'shutdown', 'halt', 'operator', 'adm', 'nobody'))
    $$;

ALTER TABLE users
    ADD COLUMN posix_user      text NOT NULL DEFAULT '' CHECK (allot_posix_account_ok(posix_user)),
    ADD COLUMN oidc_posix_user text NOT NULL DEFAULT '' CHECK (allot_posix_account_ok(oidc_posix_user));

ALTER TABLE teams
    ADD COLUMN posix_account text NOT NULL DEFAULT '' CHECK (allot_posix_account_ok(posix_account));

-- image: an OCI image reference ('' = on the host); memory_bytes and
-- milli_cpus: the per-node limits (0 = the node's default); secret_env: the
-- variables passed to the job but never shown (only their names).
ALTER TABLE jobs
    ADD COLUMN run_as_user  text NOT NULL DEFAULT '' CHECK (allot_posix_account_ok(run_as_user)),
    ADD COLUMN image        text NOT NULL DEFAULT '' CHECK (length(image) <= 255 AND image !~ '\s'),
    ADD COLUMN memory_bytes bigint NOT NULL DEFAULT 0 CHECK (memory_bytes >= 0),
    ADD COLUMN milli_cpus   bigint NOT NULL DEFAULT 0 CHECK (milli_cpus >= 0),
    ADD COLUMN secret_env   jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(secret_env) = 'object');
