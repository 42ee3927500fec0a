package replay

import "fmt"

// RangeError is a log replay whose from is not before its to.
type RangeError struct {
	From, To uint64
}

func (e *RangeError) Error() string {
	return fmt.Sprintf("nothing to replay: --from %d is not before --to %d", e.From, e.To)
}
