package views

import (
	"fmt"
	"strconv"
)

// Question is what a destructive action asks before it happens: the same
// words in the page's <dialog> and on the confirm page a browser without
// it (or without JavaScript) gets from the server.
type Question struct {
	ID      string   // the dialog's id
	Heading string   // "Cancel job 42?"
	Lines   []string // what will happen
	Yes, No string   // the buttons
}

// Confirm is the confirm page: the question, and a form that sends the
// request again with confirm=yes (and the values it came with).
type Confirm struct {
	Page
	Question
	Action string   // where the form posts
	Fields []Option // hidden fields sent again (Value: name, Label: value)
	Back   string   // the page "No" leads back to
}

// CancelQuestion asks before cancelling a job in state.
func CancelQuestion(id int64, name, state string) Question {
	q := Question{ID: "confirm-cancel", Heading: fmt.Sprintf("Cancel job %d (%s)?", id, name),
		Yes: "Yes, cancel job " + strconv.FormatInt(id, 10), No: "No, keep it"}
	if state == "running" {
		q.Lines = append(q.Lines, "It is running: its processes get SIGTERM, then SIGKILL after the policy's grace period. Work since its last checkpoint is lost.")
	} else {
		q.Lines = append(q.Lines, "It leaves the queue: it will not run (again).")
	}
	q.Lines = append(q.Lines, "A cancelled job cannot be resumed; “Resubmit as a copy” makes a new job from it.")
	return q
}

// CloseMonthQuestion asks before closing a month with these totals.
func CloseMonthQuestion(month, currency string, teams int, total Money) Question {
	return Question{ID: "confirm-close", Heading: "Close " + month + "?",
		Lines: []string{
			fmt.Sprintf("Its bill is final: %d team(s), %s GPU-hours, %s %s (charges %s, preemption credits %s, adjustments %s), as of the last hourly rollup; closing runs one more rollup first.",
				teams, total.GPUHours, total.Amount, currency, total.Charges, total.Credits, total.Adjustments),
			"After the close its numbers never change again: no rate can be backdated into it. The close is recorded in the audit log.",
		},
		Yes: "Yes, close " + month, No: "No, keep it open"}
}

// DrainQuestion asks before an admin drains a node running jobs; requeue
// is "" when the form lets the admin choose (the dialog), else "yes"/"no".
func DrainQuestion(node string, jobs int, requeue string) Question {
	q := Question{ID: "confirm-drain", Heading: "Drain " + node + "?", Yes: "Yes, drain " + node, No: "No, keep it in service"}
	q.Lines = append(q.Lines, "The scheduler places no new job on it until an admin undrains it.")
	running := fmt.Sprintf("Its %d running job(s)", jobs)
	switch requeue {
	case "yes":
		q.Lines = append(q.Lines, running+" are stopped now like a preemption (SIGTERM, the grace period, SIGKILL) and go back to the queue.")
	case "no":
		q.Lines = append(q.Lines, running+" finish first; then it is drained.")
	default:
		q.Lines = append(q.Lines, running+" finish first, or, with “and requeue” ticked, are stopped now (SIGTERM, the grace period, SIGKILL) and go back to the queue.")
	}
	return q
}
