"""Running a decision: executing a call, remembering validated plans for repeated calls, and
the compiled call front that serves them without Python."""
