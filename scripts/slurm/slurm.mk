# The local Slurm cluster's targets, included by the Makefile while this optional part is here.
.PHONY: slurm-up slurm-down

slurm-up:  ## root only: a local two-node Slurm cluster for the Slurm tests (then: source /tmp/project-local-slurm/env)
	bash scripts/slurm/local_cluster.sh up 2

slurm-down:  ## root only: stop the local Slurm cluster and remove everything it set up
	bash scripts/slurm/local_cluster.sh down
