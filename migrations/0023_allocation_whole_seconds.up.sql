-- Allocations start and end on whole seconds (issue 16).
--
-- Billing counts whole seconds: every instant is floored to its UTC second
-- and an allocation bills floor(released_at) − floor(started_at) GPU-seconds
-- (internal/billing). With instants kept to the microsecond, a month's
-- billed GPU-seconds and the sum of (released_at − started_at) over its
-- allocations differed by the fractions (1,347,903 billed against 1,347,971
-- s allocated over 2,484 allocations, one test run), and an allocation
-- shorter than a second that did not cross a second billed nothing although
-- it had a length. Like Slurm's accounting (whole seconds), the allocation's
-- instants are now stored floored to the second, so the two sums are equal
-- by construction: what is billed is what the allocations table says was
-- allocated, to the second, and an allocation within one second has length 0.
--
-- Flooring is monotone, so released_at >= started_at still holds, and two
-- allocations of one GPU that did not overlap still do not. Billing of past
-- rows does not change (it already floored each instant).
CREATE FUNCTION allocations_whole_seconds() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.started_at := date_trunc('second', NEW.started_at);
    NEW.released_at := date_trunc('second', NEW.released_at);
    RETURN NEW;
END $$;
CREATE TRIGGER allocations_whole_seconds BEFORE INSERT OR UPDATE OF started_at, released_at ON allocations
    FOR EACH ROW EXECUTE FUNCTION allocations_whole_seconds();

UPDATE allocations SET started_at = date_trunc('second', started_at), released_at = date_trunc('second', released_at)
WHERE started_at <> date_trunc('second', started_at) OR released_at <> date_trunc('second', released_at);
