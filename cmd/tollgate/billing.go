package main

import "errors"

func runBilling(args []string) error {
	return errors.New("billing: not built yet")
}

func runMigrate(args []string) error {
	return errors.New("migrate: not built yet")
}
