package config

// Check loads and validates the file at path without starting anything, for
// `tollgate config check FILE`. It returns nil for a good file, *Errors
// listing every problem for a bad one, or a wrapped I/O error when the file
// cannot be read.
func Check(path string) error {
	_, err := Load(path)
	return err
}
