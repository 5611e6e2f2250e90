package main

// sizes are the workload sizes: the for a full run, smaller ones
// for --quick.
type sizes struct {
	metaFiles, metaDirs int // metadata tree
	tarFiles            int // files in the tarball
	copyupFiles         int // original files appended to
	dataMiB             int // sequential write / read
	smallMiB            int // written in 4 KiB writes
	randMiB             int // fio random read file
	randRuntime         int // seconds, upper bound of one fio run
	gitFiles, gitEdits  int
	goPkgs, goFiles     int // generated module: packages, files per package
	lifeN               []int
	lifeK               []int
	createSamples       int // creates per tree size and repetition
	planSandboxes       int
	planFiles           int
	idleSandboxes       int
}

func sizesFor(quick bool) sizes {
	if quick {
		return sizes{
			metaFiles: 2000, metaDirs: 50,
			tarFiles:    500,
			copyupFiles: 200,
			dataMiB:     64, smallMiB: 16, randMiB: 32, randRuntime: 2,
			gitFiles: 500, gitEdits: 20,
			goPkgs: 5, goFiles: 6,
			lifeN:         []int{1000, 10000},
			lifeK:         []int{10, 100},
			createSamples: 2,
			planSandboxes: 4, planFiles: 20,
			idleSandboxes: 20,
		}
	}
	return sizes{
		metaFiles: 20000, metaDirs: 500,
		tarFiles:    5000,
		copyupFiles: 2000,
		dataMiB:     1024, smallMiB: 256, randMiB: 256, randRuntime: 5,
		gitFiles: 5000, gitEdits: 100,
		goPkgs: 30, goFiles: 10,
		lifeN:         []int{1000, 10000, 100000},
		lifeK:         []int{10, 100, 1000},
		createSamples: 3,
		planSandboxes: 16, planFiles: 100,
		idleSandboxes: 200,
	}
}
