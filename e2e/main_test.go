package e2e

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// modulePath is the module the tests build the binary of.
const modulePath = "github.com/tollgate/tollgate"

// tollgateBin is the binary built from ./cmd/tollgate by TestMain;
// repoRoot is the module's directory, where gateway.yaml lives.
var tollgateBin, repoRoot string

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	flag.Parse()
	root, err := findRepoRoot()
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	binDir, err := os.MkdirTemp("", "tollgate-e2e-bin-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	defer os.RemoveAll(binDir)
	began := time.Now()
	bin, err := buildTollgate(root, binDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: ./cmd/tollgate does not build, so no process-level test can run:\n%v\n", err)
		return 1
	}
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "e2e: built %s in %v\n", bin, time.Since(began).Round(time.Millisecond))
	}
	tollgateBin, repoRoot = bin, root
	return m.Run()
}

// buildTollgate runs `go build -o <dir>/tollgate ./cmd/tollgate` in root.
func buildTollgate(root, dir string) (string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("the go tool is not on PATH: %w", err)
	}
	bin := filepath.Join(dir, "tollgate")
	cmd := exec.Command(goTool, "build", "-o", bin, "./cmd/tollgate")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build -o %s ./cmd/tollgate: %w\n%s", bin, err, out)
	}
	return bin, nil
}

// findRepoRoot walks up from the working directory (go test runs in the
// package's directory) to the module's go.mod.
func findRepoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if isModuleRoot(dir) {
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			return "", errors.New("module " + modulePath + " not found above " + wd)
		}
	}
}

func isModuleRoot(dir string) bool {
	f, err := os.Open(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	return sc.Scan() && strings.TrimSpace(sc.Text()) == "module "+modulePath
}
