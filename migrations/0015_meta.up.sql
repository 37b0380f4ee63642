-- Facts about the database itself, one row a key: for now whether (and as
-- of when) the demo organisation was seeded completely, so `allot dev` can
-- tell a seeded database from one an interrupted seed left half-filled.
CREATE TABLE allot_meta (
    key    text PRIMARY KEY CHECK (key <> ''),
    value  text NOT NULL,
    at     timestamptz NOT NULL
);
