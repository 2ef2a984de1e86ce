package asynqwire

// ClearMsg drops the raw message of c, for comparisons.
func ClearMsg(c *Claimed) { c.msg = nil }
