package sink

import (
	"bytes"
	"fmt"

	"github.com/flowlog/flowlog/event"
)

// mvccOut receives the MVCC state a restore or a snapshot computes, key by
// key in data key order (which groups keys by table, in table id order).
type mvccOut interface {
	// live is a key visible at the ts read: raw is its raw key, dataKey
	// the data key of the version read (at commitTS), val its value. The
	// slices are valid only during the call.
	live(tid int64, raw, dataKey []byte, commitTS uint64, val []byte) error
	// noValue is a key whose visible version is a put whose value was
	// prewritten before the table's window, so the backup does not hold it.
	noValue(tid int64, dataKey []byte) error
	// table is called, after every key, for each restored table, in no
	// particular order: a table without keys still gets its output.
	table(tid int64) error
	// finish completes the output.
	finish() error
}

// writeTables runs the MVCC read over the sorted write records and the
// tables' snapshots, joining default-CF values, and hands the result to
// out. For a key, the write records read are all newer than its table's
// snapshot, so the first version met in data key order (newest first)
// decides: a write record if there is one, else the snapshot's entry.
func writeTables(o RestoreOptions, writes, defaults *extSorter, snaps *snapIter, tables map[int64]bool, out mvccOut, st *RestoreStats) error {
	// Both sorters sort their last run in memory: do it side by side.
	var (
		dit  sortedIter
		derr error
		done = make(chan struct{})
	)
	go func() { dit, derr = defaults.iter(); close(done) }()
	wit, err := writes.iter()
	<-done
	if wit != nil {
		defer wit.Close()
	}
	if dit != nil {
		defer dit.Close()
	}
	if err != nil {
		return err
	}
	if derr != nil {
		return derr
	}

	var (
		decided  []byte // encoded key whose version has been chosen
		dkey     []byte // current default-CF head
		dval     []byte
		dok      = true
		lookup   []byte
		raw      []byte
		defStart = true
		// heads of the write records and of the snapshots
		wkey, wval []byte
		wok        bool
		wnext      = true
		skey, sval []byte
		sok        bool
		snoval     bool
		stid       int64
		snext      = true
	)
	for {
		if wnext {
			if wkey, wval, wok, err = wit.next(); err != nil {
				return err
			}
			wnext = false
		}
		if snext {
			if skey, sval, snoval, stid, sok, err = snaps.next(); err != nil {
				return err
			}
			snext = false
		}
		if !wok && !sok {
			break
		}
		fromSnap := sok && (!wok || bytes.Compare(skey, wkey) < 0)
		key, value := wkey, wval
		if fromSnap {
			key, value = skey, sval
			snext = true
		} else {
			wnext = true
		}
		encoded, commitTS, err := event.SplitDataKey(key)
		if err != nil {
			return err
		}
		if decided != nil && bytes.Equal(encoded, decided) {
			continue // an older version, or a duplicate of the chosen one
		}
		if !o.keys.holds(encoded) {
			continue // a snapshot chunk's key outside the key range
		}
		// Lock and rollback records and ts > TS were dropped when read, so
		// this is the newest visible put or delete of the key.
		decided = append(decided[:0], encoded...)
		raw = appendRaw(raw[:0], encoded)
		tid, ok := event.TableIDOfRaw(raw)
		if fromSnap && (!ok || tid != stid) {
			return fmt.Errorf("restore: snapshot of table %d holds a key of another table", stid)
		}
		if !ok || o.Tables != nil && !o.Tables[tid] {
			continue
		}
		if fromSnap {
			if snoval {
				st.NoValue++
				if err := out.noValue(tid, key); err != nil {
					return err
				}
				continue
			}
			if err := out.live(tid, raw, key, commitTS, value); err != nil {
				return err
			}
			st.Keys++
			continue
		}
		w, err := event.DecodeWrite(value)
		if err != nil {
			return err
		}
		if w.Type == event.WriteDelete {
			continue
		}
		val := w.ShortValue
		if !w.HasShortValue {
			lookup = append(append(lookup[:0], encoded...), tsBytes(w.StartTS)...)
			for dok && (defStart || bytes.Compare(dkey, lookup) < 0) {
				defStart = false
				dkey, dval, dok, err = dit.next()
				if err != nil {
					return err
				}
			}
			if !dok || !bytes.Equal(dkey, lookup) {
				if win, ok := o.Windows[tid]; ok && w.StartTS <= win.Since {
					st.NoValue++ // prewritten before the window: not backed up
					if err := out.noValue(tid, key); err != nil {
						return err
					}
					continue
				}
				return fmt.Errorf("restore: table %d: put at commit ts %d has no short value and no default-CF entry at start ts %d", tid, commitTS, w.StartTS)
			}
			val = dval
		}
		if err := out.live(tid, raw, key, commitTS, val); err != nil {
			return err
		}
		st.Keys++
		if o.progress != nil && st.Keys%(1<<16) == 0 {
			o.progress(*st)
		}
	}
	for id := range tables {
		if err := out.table(id); err != nil {
			return err
		}
	}
	return out.finish()
}

// jsonlOut writes a restore's <table_id>.jsonl files.
type jsonlOut struct {
	w *tableWriter
}

func (j *jsonlOut) live(tid int64, raw, _ []byte, commitTS uint64, val []byte) error {
	return j.w.writeLine(tid, raw, val, commitTS)
}

func (j *jsonlOut) noValue(int64, []byte) error { return nil }

// table creates an empty file for a table whose keys are all absent.
func (j *jsonlOut) table(id int64) error {
	if j.w.written[id] {
		return nil
	}
	return j.w.open(id)
}

func (j *jsonlOut) finish() error { return j.w.finish() }
