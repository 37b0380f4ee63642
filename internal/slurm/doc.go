// Package slurm is Allot's client for slurmrestd (see the package README
// section below, filled in as findings are confirmed).
package slurm
