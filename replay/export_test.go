package replay

import "time"

// SetDeliveryTimeout sets the delivery timeout of targets made after it,
// and returns the function that restores it.
func SetDeliveryTimeout(d time.Duration) func() {
	old := deliveryTimeout
	deliveryTimeout = d
	return func() { deliveryTimeout = old }
}
