package meter

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
)

// DamageRecord flips a byte in the body of record seq in the outbox in
// dir, as a bad disk block would, for the tests of package meter_test.
func DamageRecord(dir string, seq uint64) error {
	segs, _ := filepath.Glob(filepath.Join(dir, "*"+outboxSegmentExt))
	for _, path := range segs {
		data, err := os.ReadFile(path)
		if err != nil || !bytes.HasPrefix(data, []byte(outboxMagic)) {
			continue
		}
		for off := outboxHeaderSize; off < len(data); {
			rec, n, err := decodeOutboxRecord(data[off:], 2)
			if err != nil {
				break
			}
			if rec.seq == seq {
				data[off+outboxRecordHeader+20] ^= 0x20
				return os.WriteFile(path, data, 0o600)
			}
			off += n
		}
	}
	return fmt.Errorf("no record %d in %s", seq, dir)
}

// FailOutboxSyncs has every sync of ob's mapped segments fail with err,
// as on a file system remounted read-only after an I/O error, or succeed
// again when err is nil.
func FailOutboxSyncs(ob *Outbox, err error) {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	if err == nil {
		ob.syncMem = syncMapped
		return
	}
	ob.syncMem = func([]byte) error { return err }
}

// WriteAckedFile replaces the acked file of the outbox in dir, as one
// that could not be written for a while (a full disk) leaves it.
func WriteAckedFile(dir string, seq uint64) error { return writeAcked(dir, seq) }
