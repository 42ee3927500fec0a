package gcs

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// kmsKeyForm is the one form GCS takes as an object's KMS key.
const kmsKeyForm = "projects/P/locations/L/keyRings/R/cryptoKeys/K"

var (
	// kmsIDRE is what Cloud KMS accepts as a key ring or key id.
	kmsIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,63}$`)
	// projectRE admits project ids, domain-scoped ids (example.com:p) and
	// project numbers.
	projectRE = regexp.MustCompile(`^[a-z0-9][a-z0-9.:-]{0,99}$`)
	// locationRE admits regions, multi-regions and "global".
	locationRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,62}$`)
)

// validateKMSKey checks that key has the form of kmsKeyForm. Whether the key
// exists, is enabled, and is usable by the bucket's service agent only GCS
// can tell, at the first write.
func validateKMSKey(key string) error {
	parts := strings.Split(key, "/")
	if len(parts) == 10 && parts[8] == "cryptoKeyVersions" {
		return fmt.Errorf("names a key version: give the key itself (%s), without /cryptoKeyVersions/%s", kmsKeyForm, parts[9])
	}
	if len(parts) != 8 || parts[0] != "projects" || parts[2] != "locations" || parts[4] != "keyRings" || parts[6] != "cryptoKeys" {
		return fmt.Errorf("want %s", kmsKeyForm)
	}
	var errs []string
	if !projectRE.MatchString(parts[1]) {
		errs = append(errs, fmt.Sprintf("project %q is not a project id", parts[1]))
	}
	if !locationRE.MatchString(parts[3]) {
		errs = append(errs, fmt.Sprintf("location %q is not a location", parts[3]))
	}
	if !kmsIDRE.MatchString(parts[5]) {
		errs = append(errs, fmt.Sprintf("key ring %q is not 1-63 letters, digits, '_' or '-'", parts[5]))
	}
	if !kmsIDRE.MatchString(parts[7]) {
		errs = append(errs, fmt.Sprintf("key %q is not 1-63 letters, digits, '_' or '-'", parts[7]))
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}
