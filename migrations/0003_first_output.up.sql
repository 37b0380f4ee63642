-- When a job's first line of output reached the server (for the
-- submit-to-first-output latency that users feel).
ALTER TABLE jobs ADD COLUMN first_output_at timestamptz;
