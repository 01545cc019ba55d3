"""All of the package's SQL: typed statements built once, run by the repository and the ager."""
