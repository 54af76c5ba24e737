package meter

// SetBillingHooks sets the test hooks of o: run after the INSERT and after
// the debits of each batch; an error ends RunBilling without acking.
func SetBillingHooks(o *BillingOptions, afterInsert, afterDebit func() error) {
	o.afterInsert, o.afterDebit = afterInsert, afterDebit
}
