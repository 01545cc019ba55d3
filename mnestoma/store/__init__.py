"""The operations of contract §4 on a session: the repositories (commands and queries) and
the units of work that own their transactions."""
