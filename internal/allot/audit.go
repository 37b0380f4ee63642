package allot

import (
	"encoding/json"
	"time"
)

// AuditEntry is one row of the audit log: who changed what, when, and the
// value before and after. Policy changes also name the policy version they
// created.
type AuditEntry struct {
	ID            int64
	At            time.Time
	Actor         string // user email, or "system"
	Action        string // "<object kind>.<verb>", e.g. "tier.update", "node.drain"
	Object        string // "<kind>:<id>", e.g. "tier:3", "node:gpu01"
	PolicyVersion int64  // 0 when the change made no policy version
	Before        json.RawMessage
	After         json.RawMessage
	Note          string
}

// ActorSystem is the actor of changes Allot makes by itself (health rules,
// burst, automatic undrain).
const ActorSystem = "system"
