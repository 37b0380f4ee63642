-- What a submission is judged on besides allocations and nodes (which have
-- their own epochs, 0022): the team's budget and POSIX account, the tier's
-- time limit, the GPU types, and the submitter's (and other users') POSIX
-- accounts. Every committed change to them moves this sequence on (at
-- commit: a deferred trigger), so that an API request reads the three
-- epochs with its token (store.UserByAPITokenContext) and its submission
-- reuses the context judged for an earlier one, without a second round
-- trip, while nothing it depends on changed.
CREATE SEQUENCE config_epoch;
-- One trigger function for any epoch: the sequence is its argument.
CREATE FUNCTION allot_epoch_bump() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM nextval(TG_ARGV[0]::regclass);
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER config_epoch_bump AFTER INSERT OR UPDATE OR DELETE ON teams
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION allot_epoch_bump('config_epoch');
CREATE CONSTRAINT TRIGGER config_epoch_bump AFTER INSERT OR UPDATE OR DELETE ON tiers
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION allot_epoch_bump('config_epoch');
CREATE CONSTRAINT TRIGGER config_epoch_bump AFTER INSERT OR UPDATE OR DELETE ON gpu_types
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION allot_epoch_bump('config_epoch');
CREATE CONSTRAINT TRIGGER config_epoch_bump AFTER INSERT OR DELETE OR UPDATE OF posix_user, oidc_posix_user ON users
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION allot_epoch_bump('config_epoch');
