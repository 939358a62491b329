"""Ranks of a job: each process's capture manifest, the collectives issued inside its captures,
a communication resource's first use inside one, and the live comparison of the ranks.

An opt-in feature beside inspection and the census, on where the process has a rank identity;
it imports only the layers below it."""
