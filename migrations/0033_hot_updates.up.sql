-- Leave room in each page of the two tables whose rows are rewritten all
-- the time, so that PostgreSQL can keep the new version of a row on its
-- own page (a heap-only tuple, HOT) and skip every index: jobs' priority,
-- breakdown and pending reason, which the scheduling cycles write (none is
-- indexed), and leases' seen mark and process statistics, which every
-- heartbeat of a busy node writes. With full pages (fillfactor 100) each
-- such write put a new entry in all seven indexes of jobs. Pages written
-- before this migration keep what they hold; new ones leave the room.
ALTER TABLE jobs SET (fillfactor = 70);
ALTER TABLE leases SET (fillfactor = 70);
