"""The bottom of the package: the rules with their numbers, the errors, the value and column
types, time, input checks and settings. Nothing here knows an engine, a table or a session."""
