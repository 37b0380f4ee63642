-- A job's output reaches the server exactly once, across agent restarts.
--
-- The agent records how far into a job's output file the server has the
-- lines only after the server acknowledged them, so an agent killed between
-- the two resends the last batch. Each line now carries the byte offset at
-- which it ends in the job's output file; leases.log_end is the highest
-- offset the server has taken for the lease, and lines that end at or
-- before it are dropped as already received.
ALTER TABLE leases ADD COLUMN log_end bigint NOT NULL DEFAULT 0;
