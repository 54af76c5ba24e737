package billing

// SetHooks sets the test hooks of o: run after the INSERT and after
// the debits of each batch; an error ends Run without acking.
func SetHooks(o *Options, afterInsert, afterDebit func() error) {
	o.afterInsert, o.afterDebit = afterInsert, afterDebit
}
