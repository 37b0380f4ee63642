-- The chargeback exports page through a month's lines in the order
-- (team, job_id, usage_hour, kind, line_key) (store.EachChargeRowIn). With
-- the index ending at job_id, a job with many lines (or a month with one
-- team and job) made every page of 2,000 rows sort the whole month: a
-- 1,000,000-line export took minutes. This index has the whole order, so a
-- page reads its 2,000 rows and stops; it replaces the shorter one, whose
-- lookups (month, team, job) it serves as well.
CREATE INDEX charge_lines_export_idx ON charge_lines (month, team, job_id, usage_hour, kind, line_key);
DROP INDEX charge_lines_month_idx;
