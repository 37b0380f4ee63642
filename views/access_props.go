package views

import (
	"fmt"
	"strconv"
)

// AdminNodeTokens is /admin/node-tokens: the node agents' tokens (never
// their secrets), a form for a new one, and revoke and rotate buttons.
type AdminNodeTokens struct {
	Page
	Tokens []NodeTokenRow
	Nodes  []Option // the nodes a token can be made for
	// Node is the node the list is narrowed to ("" = all) and the one the
	// form preselects.
	Node   string
	Errors map[string]string
	// NewSecret is a token just made (or rotated in), shown this once.
	NewSecret, NewNode string
	Revoked            []string // what a rotation revoked, as "ID (prefix…)"
	Saved              string   // a confirmation after a revoke
}

// NodeTokenRow is one node token in the list.
type NodeTokenRow struct {
	ID        int64
	Node      string
	Prefix    string
	CreatedBy string
	Created   string
	LastUsed  string
	Status    string // active, or "revoked <when> by <who>"
	Active    bool
}

// RevokeNodeTokenQuestion asks before revoking node token id of node.
func RevokeNodeTokenQuestion(id int64, node, prefix string) Question {
	n := strconv.FormatInt(id, 10)
	return Question{ID: "confirm-revoke-" + n, Heading: fmt.Sprintf("Revoke node token %s (%s…) of %s?", n, prefix, node),
		Lines: []string{
			"The agent using it is refused (401) from its next request: it stops getting work and its heartbeats stop counting, so " + node + " goes down unless it has another token.",
			"A revoked token never works again; make a new one (or rotate) for the agent. The revocation is recorded in the audit log.",
		},
		Yes: "Yes, revoke token " + n, No: "No, keep it"}
}

// RotateNodeTokenQuestion asks before rotating node's token; qid tells
// the dialogs of several rows apart.
func RotateNodeTokenQuestion(qid, node string) Question {
	return Question{ID: "confirm-rotate-" + qid, Heading: "Rotate the token of " + node + "?",
		Lines: []string{
			"A new token for " + node + " is made and shown once; every other token of " + node + " is revoked at once.",
			"Until its agent runs with the new token (ALLOT_NODE_TOKEN or --token-file) it is refused (401). The rotation is recorded in the audit log.",
		},
		Yes: "Yes, rotate " + node + "'s token", No: "No, keep the token"}
}

// AdminUsers is /admin/users: people, their roles and whether they are
// disabled, with disable and enable buttons.
type AdminUsers struct {
	Page
	Users []UserRow
	Saved string
	Error string
}

// UserRow is one person in the list.
type UserRow struct {
	ID        int64
	Email     string
	Name      string
	Roles     string
	Tokens    int // active API tokens
	Disabled  bool
	Status    string // "active", or "disabled <when> by <who>"
	Self      bool   // the admin looking at the page
	Created   string
	DisableQ  Question
	ActionURL string // /admin/users/<email>/disable or …/enable
}

// DisableUserQuestion asks before disabling a person with tokens active
// API tokens.
func DisableUserQuestion(id int64, email string, tokens int) Question {
	return Question{ID: "confirm-disable-" + strconv.FormatInt(id, 10), Heading: "Disable " + email + "?",
		Lines: []string{
			fmt.Sprintf("All their API tokens (%d active) are revoked and all their portal sessions end now.", tokens),
			"They cannot sign in again until an admin enables them; enabling does not bring their tokens back. Their jobs are not cancelled. This is recorded in the audit log.",
		},
		Yes: "Yes, disable " + email, No: "No, keep them"}
}
