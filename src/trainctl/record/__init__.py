"""A job's record in the store, a module for each thing it does: keys.py where a job's
objects are (and the times a record holds), models.py the record as data (and its text
views), costs.py what a job cost, jobstore.py reading and writing it (the lease, events,
metrics, the stop marker), search.py finding jobs, locations.py where a job's outputs go.
Read by clients, controllers and node agents alike."""
