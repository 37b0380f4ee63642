-- Chargeback: versioned tier multipliers, charge lines written by the
-- hourly rollup, and closed months (which the database keeps unchanged).

CREATE TABLE tier_multipliers (
    tier            text NOT NULL REFERENCES tiers(id),
    multiplier_bp   integer NOT NULL CHECK (multiplier_bp BETWEEN 0 AND 100000),
    effective_from  timestamptz NOT NULL,
    PRIMARY KEY (tier, effective_from)
);
INSERT INTO tier_multipliers (tier, multiplier_bp, effective_from)
SELECT id, multiplier_bp, '1970-01-01' FROM tiers;

CREATE TABLE billing_months (
    month      date PRIMARY KEY CHECK (extract(day FROM month) = 1),
    closed_at  timestamptz NOT NULL,
    closed_by  text NOT NULL
);

CREATE TABLE charge_lines (
    line_key         text PRIMARY KEY,
    month            date NOT NULL CHECK (extract(day FROM month) = 1),
    kind             text NOT NULL CHECK (kind IN ('charge', 'preemption_credit', 'adjustment')),
    adjusts          text NOT NULL DEFAULT '',
    usage_hour       timestamptz NOT NULL,
    job_id           bigint NOT NULL REFERENCES jobs(id),
    segment          integer NOT NULL,
    team             text NOT NULL,
    cost_center      text NOT NULL,
    user_email       text NOT NULL,
    tier             text NOT NULL,
    gpu_type         text NOT NULL,
    rate_from        timestamptz NOT NULL,
    multiplier_from  timestamptz NOT NULL,
    from_at          timestamptz NOT NULL,
    to_at            timestamptz NOT NULL,
    gpu_seconds      bigint NOT NULL,
    rate_micros      bigint NOT NULL CHECK (rate_micros >= 0),
    multiplier_bp    integer NOT NULL CHECK (multiplier_bp >= 0),
    amount_micros    bigint NOT NULL,
    currency         char(3) NOT NULL,
    CHECK (kind <> 'charge' OR (amount_micros >= 0 AND gpu_seconds >= 0)),
    CHECK (kind <> 'preemption_credit' OR (amount_micros <= 0 AND gpu_seconds <= 0))
);
CREATE INDEX charge_lines_month_idx ON charge_lines (month, team, job_id);

-- A closed month never changes, whatever the code does.
CREATE FUNCTION charge_lines_closed_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND EXISTS (SELECT 1 FROM billing_months WHERE month = OLD.month) THEN
        RAISE EXCEPTION 'billing month % is closed', to_char(OLD.month, 'YYYY-MM') USING ERRCODE = 'check_violation';
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND EXISTS (SELECT 1 FROM billing_months WHERE month = NEW.month) THEN
        RAISE EXCEPTION 'billing month % is closed', to_char(NEW.month, 'YYYY-MM') USING ERRCODE = 'check_violation';
    END IF;
    RETURN COALESCE(NEW, OLD);
END $$;
CREATE TRIGGER charge_lines_closed BEFORE INSERT OR UPDATE OR DELETE ON charge_lines
    FOR EACH ROW EXECUTE FUNCTION charge_lines_closed_guard();
