-- The last time an API server heard a node's agent knock when it could not
-- let the request in (a heartbeat or a lease report that admission control
-- refused: the server was overloaded). The token it knocked with had
-- authenticated as that node shortly before. A node is marked down only
-- when it has been silent both ways for the lost window: an overloaded
-- control plane must not fail every job of nodes that are alive and trying
-- to report (issue 16).
ALTER TABLE nodes ADD COLUMN last_contact timestamptz;
